"""Ctrl-C ends a command within a second, with nothing half-written (issue 49 item 1).

Each test starts the real console command as a terminal's foreground process group,
waits until it is busy (reading a slow price API, ...), sends SIGINT to the group as a
terminal's Ctrl-C does, and measures how long the process takes to end. The bound is
generous (a loaded machine) but real: the old refresh went on for 21.5 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.billing.test_focus import HANDMADE
from tests.helpers.faults import Faults, fault_proxy
from tests.helpers.waiting import wait_for
from tests.refresh.records import AZURE_ITEMS
from tests.refresh.servers import LocalServer, Reply, Request, azure_prices_handler

#: Seconds from Ctrl-C to the end of the process, allowed on a busy test machine.
ENDS_WITHIN_S = 5.0


def start(argv: list[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
    """``costguard ARGV`` as a terminal's foreground job: a process group of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "costguard", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )


def ctrl_c(proc: subprocess.Popen[str]) -> tuple[float, str, str]:
    """SIGINT to the process group; the seconds until it ended, and what it printed."""
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return time.monotonic() - sent, out, err


@pytest.fixture
def slow_azure_prices() -> Iterator[LocalServer]:
    """The Azure Retail Prices API answering each page after 0.3 s, and never the last
    page (a NextPageLink on every one): a refresh of it ends only when stopped."""
    pages = azure_prices_handler(AZURE_ITEMS, page_size=1)

    def handle(server: LocalServer, request: Request) -> Reply:
        time.sleep(0.3)
        reply = pages(server, request)
        if isinstance(reply.body, dict) and reply.status == 200:
            skip = int(request.query.get("$skip") or 0) + 1
            query = urlencode({**request.query, "$skip": skip})
            reply.body["NextPageLink"] = f"{server.url}/api/retail/prices?{query}"
        return reply

    server = LocalServer(handle)
    yield server
    server.close()


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSTGUARD_")}
    env.update(COSTGUARD_CACHE_DIR=str(tmp_path / "cache"), XDG_CONFIG_HOME=str(tmp_path / "none"))
    return env


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is left (a zombie counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_stops_a_price_refresh(tmp_path: Path, slow_azure_prices: LocalServer) -> None:
    env = clean_env(tmp_path)
    env["COSTGUARD_AZURE_PRICES_ENDPOINT"] = slow_azure_prices.url
    regions = ["eastus", "westus2", "westeurope", "northeurope", "southcentralus"]
    argv = ["pricing", "refresh", "--provider", "azure", "--output", str(tmp_path / "out")]
    proc = start(argv + [w for r in regions for w in ("--region", r)], env)
    wait_for(lambda: len(slow_azure_prices.requests) >= 10, "the refresh busy with pages")
    seconds, _, err = ctrl_c(proc)
    assert proc.returncode == 130, err
    assert seconds < ENDS_WITHIN_S, f"{seconds:.1f} s after Ctrl-C"
    # Nothing is left to read prices: the process has exited, and nothing it started
    # (in its process group) lives on.
    wait_for(lambda: not group_alive(proc.pid), "no process of the refresh left", timeout_s=10)
    written = list((tmp_path / "out").rglob("*")) if (tmp_path / "out").exists() else []
    assert written == [], f"half a refresh written: {written}"
    assert "Traceback" not in err


def test_ctrl_c_during_an_export_leaves_no_part_of_it(tmp_path: Path) -> None:
    """A checkpoint export (400 MB) stopped while it writes: it ends at once, and the
    target is not there, nor its temporary file (the main thread unwinds before the exit)."""
    import torch

    from costguard.checkpoint import Checkpointer

    store = tmp_path / "ckpt"
    weights = torch.nn.Linear(10_000, 10_000)  # 400 MB of float32
    with Checkpointer(str(store), every_steps=1) as ckpt:
        ckpt.step(0, model=weights)
    del weights
    out = tmp_path / "out"
    out.mkdir()
    target = out / "model.safetensors"
    proc = start(["checkpoint", "export", str(store), "--to", str(target)], clean_env(tmp_path))
    wait_for(
        lambda: any(out.iterdir()) or proc.poll() is not None,
        "the command busy writing (or ended)",
        timeout_s=120,
    )
    assert proc.poll() is None, "the export ended before Ctrl-C: nothing was tested"
    seconds, _, err = ctrl_c(proc)
    assert proc.returncode == 130, err
    assert seconds < ENDS_WITHIN_S, f"{seconds:.1f} s after Ctrl-C"
    assert list(out.iterdir()) == [], "half an export left behind"


@pytest.fixture(scope="module")
def slow_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The hand-made FOCUS export's rows over and over (200,000), each with a tags text of
    its own, as CSV.gz and Parquet: spend reads them for many seconds (each distinct
    text is parsed once), where writing them takes one."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("exports")
    sample = pcsv.read_csv(HANDMADE)
    numbers = pa.array(range(200_000))
    table = sample.take(pc.bit_wise_and(numbers, 7))  # the sample's first eight rows
    tags = pc.binary_join_element_wise(
        '{"costguard:job": "job-', pc.cast(numbers, pa.string()), '"}', ""
    )
    table = table.set_column(table.schema.get_field_index("Tags"), "Tags", tags)
    pq.write_table(table, folder / "export.parquet", row_group_size=20_000)
    with pa.CompressedOutputStream(str(folder / "export.csv.gz"), "gzip") as out:
        pcsv.write_csv(table, out)
    return {"csv.gz": folder / "export.csv.gz", "parquet": folder / "export.parquet"}


def has_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` holds ``path`` open (it is reading it)."""
    fds = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        return any(os.path.realpath(fd) == str(path.resolve()) for fd in fds.iterdir())
    return False


def assert_stopped_cleanly(proc: subprocess.Popen[str], plot: Path) -> None:
    """Ctrl-C to ``proc`` (busy): it ends within the bound, 130, with one line and nothing
    else, and no picture (--plot) written."""
    seconds, out, err = ctrl_c(proc)
    assert proc.returncode == 130, err
    assert seconds < ENDS_WITHIN_S, f"{seconds:.1f} s after Ctrl-C"
    assert err == "Aborted.\n"  # one line: click's own answer wrote an empty one first
    assert out == ""  # no half a table
    assert not plot.exists()


@pytest.mark.parametrize("kind", ["csv.gz", "parquet"])
def test_ctrl_c_stops_spend_reading_an_export(
    tmp_path: Path, slow_exports: dict[str, Path], kind: str
) -> None:
    """Issue 49: Ctrl-C while spend reads a billing export (a real process, SIGINT to its
    group as a terminal sends it, the file open and being read)."""
    path, plot = slow_exports[kind], tmp_path / "spend.png"
    proc = start(["spend", str(path), "--by", "job", "--plot", str(plot)], clean_env(tmp_path))
    wait_for(lambda: has_open(proc.pid, path) or proc.poll() is not None, "spend reading the file")
    time.sleep(0.5)  # into the file
    assert proc.poll() is None, "spend ended before Ctrl-C: nothing was tested"
    assert_stopped_cleanly(proc, plot)


def test_ctrl_c_stops_spend_waiting_on_a_bucket(aws_env: str, tmp_path: Path) -> None:
    """Issue 49: Ctrl-C while spend waits for an export's bytes from S3 (moto behind a
    proxy that holds the object's GET): the wait on the network ends too."""
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="lab-bills")
    s3.put_object(Bucket="lab-bills", Key="focus/export.csv", Body=HANDMADE.read_bytes())
    faults = Faults(eligible=lambda method, path: method == "GET" and "export.csv" in path)
    faults.delay_s = 60
    with fault_proxy(aws_env, faults) as proxy:
        env = {**clean_env(tmp_path), "AWS_ENDPOINT_URL": proxy}
        plot = tmp_path / "spend.png"
        proc = start(["spend", "s3://lab-bills/focus/", "--plot", str(plot)], env)
        wait_for(lambda: faults.inflight > 0 or proc.poll() is not None, "spend's GET held")
        assert proc.poll() is None, "spend ended before Ctrl-C: nothing was tested"
        assert_stopped_cleanly(proc, plot)
