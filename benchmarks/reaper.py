"""CloudWatch calls of one `costguard reap` run next to a per-instance metrics loop, in one run.

A moto server (started here, loopback) holds a fleet of GPU instances with GPU (CWAgent),
CPU and network metrics. The reaper judges the whole fleet; then the cloud-custodian way
(one ``GetMetricStatistics`` per instance and metric) reads the same metrics. Both are
counted with a botocore ``before-call`` hook on their CloudWatch client.

Targets: reaper calls <= ceil(instances x queries per instance / 500), and at least 100x
fewer calls than the per-instance loop. Wall times are printed too, but they are moto's,
not AWS's.

    python benchmarks/reaper.py [--instances 1000] [--idle-minutes 10]
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

METRICS = (
    ("CWAgent", "nvidia_smi_utilization_gpu", "Maximum", 1.0),
    ("AWS/EC2", "CPUUtilization", "Maximum", 2.0),
    ("AWS/EC2", "NetworkIn", "Sum", 1000.0),
    ("AWS/EC2", "NetworkOut", "Sum", 1000.0),
)
TARGET_RATIO = 100


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def counted_client(service: str, counter: Counter[str]) -> Any:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        service, region_name="us-east-1", config=Config(retries={"max_attempts": 1})
    )

    def record(model: Any, **_: Any) -> None:
        counter[model.name] += 1

    client.meta.events.register("before-call", record)
    return client


def seed(ec2: Any, cloudwatch: Any, count: int, now: datetime, minutes: int) -> list[str]:
    """``count`` g5.xlarge instances with idle metrics, one point per 5 minutes."""
    ids: list[str] = []
    while len(ids) < count:
        batch = min(250, count - len(ids))
        reply = ec2.run_instances(
            ImageId="ami-12c6146b", MinCount=batch, MaxCount=batch, InstanceType="g5.xlarge"
        )
        ids += [i["InstanceId"] for i in reply["Instances"]]
    times = [now - timedelta(minutes=2 + 5 * k) for k in range(minutes // 5 + 1)]
    for namespace in sorted({m[0] for m in METRICS}):
        data = [
            {
                "MetricName": name,
                "Dimensions": [{"Name": "InstanceId", "Value": iid}],
                "Timestamp": at,
                "Value": value,
            }
            for iid in ids
            for ns, name, _, value in METRICS
            if ns == namespace
            for at in times
        ]
        for start in range(0, len(data), 1000):  # the PutMetricData limit
            cloudwatch.put_metric_data(Namespace=namespace, MetricData=data[start : start + 1000])
    return ids


def per_instance_loop(cloudwatch: Any, ids: list[str], start: datetime, end: datetime) -> None:
    """What a per-resource metrics filter does: one call per instance and metric."""
    for iid in ids:
        for namespace, name, stat, _ in METRICS:
            cloudwatch.get_metric_statistics(
                Namespace=namespace,
                MetricName=name,
                Dimensions=[{"Name": "InstanceId", "Value": iid}],
                StartTime=start,
                EndTime=end,
                Period=300,
                Statistics=[stat],
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--idle-minutes", type=int, default=10)
    args = parser.parse_args()
    from moto.server import ThreadedMotoServer

    from costguard.pricing.tables import load_catalog
    from costguard.reaper.aws import MAX_LAG_SECONDS, MAX_QUERIES, PERIOD_SECONDS, AwsFleet
    from costguard.reaper.fleet import PriceBook, reap
    from costguard.reaper.policy import IdlePolicy, ReapLimits

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        os.environ.update(
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
        )
        setup: Counter[str] = Counter()
        ids = seed(
            counted_client("ec2", setup), counted_client("cloudwatch", setup),
            args.instances, datetime.now(UTC), args.idle_minutes,
        )  # fmt: skip
        now = datetime.now(UTC)  # after every launch: moto stamps LaunchTime at launch
        reaper_calls: Counter[str] = Counter()
        fleet = AwsFleet(
            "us-east-1",
            PriceBook(load_catalog()),
            ec2=counted_client("ec2", Counter()),
            cloudwatch=counted_client("cloudwatch", reaper_calls),
        )
        # Grace 0: moto stamps every instance "now". The limit is raised so the plan is whole.
        policy = IdlePolicy(
            idle_minutes=args.idle_minutes,
            grace_minutes=0,
            sample_period_seconds=PERIOD_SECONDS,
            max_lag_seconds=MAX_LAG_SECONDS,
        )
        started = time.perf_counter()
        report = reap([fleet], policy, ReapLimits(max_actions=args.instances), now, execute=False)
        reaper_s = time.perf_counter() - started
        selected = len(report.plan.selected)

        loop_calls: Counter[str] = Counter()
        started = time.perf_counter()
        per_instance_loop(counted_client("cloudwatch", loop_calls), ids, now - policy.window, now)
        loop_s = time.perf_counter() - started
    finally:
        server.stop()

    queries = args.instances * len(METRICS)
    bound = math.ceil(queries / MAX_QUERIES)
    reaper_total = sum(reaper_calls.values())
    loop_total = sum(loop_calls.values())
    ratio = loop_total / max(1, reaper_total)
    print(f"fleet: {args.instances} GPU instances, {len(METRICS)} CloudWatch metrics each "
          f"({', '.join(m[1] for m in METRICS)}), {args.idle_minutes} min window")  # fmt: skip
    print(f"reaper: {reaper_total} CloudWatch calls per run {dict(reaper_calls)}; "
          f"bound ceil({queries}/{MAX_QUERIES}) = {bound}; {selected} judged idle; "
          f"{reaper_s:.1f} s on moto")  # fmt: skip
    print(f"per-instance GetMetricStatistics loop: {loop_total} calls; {loop_s:.1f} s on moto")
    verdict = "meets" if reaper_total <= bound and ratio >= TARGET_RATIO else "MISSES"
    print(f"ratio loop / reaper: {ratio:.0f}x fewer calls "
          f"({verdict} the targets <= {bound} calls and >= {TARGET_RATIO}x)")  # fmt: skip
    if verdict == "MISSES":
        sys.exit(1)


if __name__ == "__main__":
    main()
