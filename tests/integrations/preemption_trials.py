"""Randomized preemption trials of ``costguard run --sync-dir`` with fresh trainer scripts
(issue 45): each trial runs a script under costguard on a new machine each time (the
output folder deleted before every attempt), sends the notice (SIGTERM to costguard run)
at a random moment after the script is ready, and starts again until the script
finishes. Checked at every attempt: the script resumes from the newest checkpoint in the
store (no lost checkpoint, no silent restart from step 0) and a notice ends it with 75;
at the end the weights equal, bit for bit, those of the same script run uninterrupted
without costguard.

``python -m tests.integrations.preemption_trials TRAINER TRIALS SEED [URL]`` (TRAINER:
hf, accelerate or lightning; URL: a store, by default a local folder) prints one JSON line
per trial; ``tests/integrations/test_preemption_trials.py`` runs them in the suite."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.helpers.training import Followed, child_env, costguard_command

TRIALS_DIR = Path(__file__).with_name("trials")
SCRIPTS = {"hf": "hf_trial.py", "accelerate": "accelerate_trial.py",
           "lightning": "lightning_trial.py"}  # fmt: skip
#: The notice comes this many seconds after the script says it is ready, at most (its
#: steps take about 0.1 s each; imports before it are not counted). An attempt resumed at
#: the last step gets one too: it lands in the script's teardown, or after it ended.
MOST_DELAY_S = 3.0
MOST_ATTEMPTS = 12
TIMEOUT_S = 600


def newest_kept(url: str) -> int:
    """The step of the newest ``--sync-dir`` checkpoint in the store (0: none)."""
    from costguard.checkpoint.restoring import Restorer
    from costguard.checkpoint.store import Store

    text = os.environ.get("COSTGUARD_STORAGE_OPTIONS")
    survey = Restorer(Store.open(url, json.loads(text) if text else None)).survey()
    return max((m.step for m in survey.manifests if m.folder), default=0)


def reference(trainer: str, folder: Path, env: dict[str, str]) -> Path:
    """The final weights of the script run once, uninterrupted, without costguard."""
    final = folder / "reference.pt"
    script = str(TRIALS_DIR / SCRIPTS[trainer])
    run = Followed([sys.executable, script, str(folder / "ref-out"), str(final)], env, TIMEOUT_S)
    assert run.finish() == 0, run.stderr()[-3000:]
    return final


def trial(
    trainer: str,
    url: str,
    folder: Path,
    env: dict[str, str],
    rng: random.Random,
    *,
    most_notices: int = MOST_ATTEMPTS,
    most_delay_s: float = MOST_DELAY_S,
) -> dict[str, Any]:
    """One trial: attempts until the script finishes, the first ``most_notices`` of them
    each sent a notice at a random moment up to ``most_delay_s`` after the script is
    ready; what each did, and any problem."""
    out, final = folder / "out", folder / "final.pt"
    script = str(TRIALS_DIR / SCRIPTS[trainer])
    command = [*costguard_command(), "run", "--checkpoint", url, "--sync-dir", str(out), "--",
               sys.executable, script, str(out), str(final)]  # fmt: skip
    record: dict[str, Any] = {"trainer": trainer, "ready": [], "codes": [], "delays": [],
                              "problems": []}  # fmt: skip
    for number in range(MOST_ATTEMPTS):
        shutil.rmtree(out, ignore_errors=True)  # a new machine
        expected = newest_kept(url)
        run = Followed(command, env, TIMEOUT_S)
        ready = int(run.read_until(lambda line: line.startswith("READY")).split()[1])
        record["ready"].append(ready)
        if ready != expected:
            record["problems"].append(f"resumed from {ready}, the store's newest is {expected}")
        if number < most_notices:
            delay = round(rng.uniform(0.0, most_delay_s), 2)
            record["delays"].append(delay)
            time.sleep(delay)
            if run.proc.poll() is None:
                run.proc.send_signal(signal.SIGTERM)
        code = run.finish()
        record["codes"].append(code)
        if code == 0:
            break
        if code != 75:
            record["problems"].append(f"exit {code}: {run.stderr()[-500:]}")
            break
    else:
        record["problems"].append(f"not finished in {MOST_ATTEMPTS} attempts")
    return record


def same_weights(a: Path, b: Path) -> bool:
    import torch

    left, right = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def main() -> None:
    trainer, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        env = child_env(Path(tmp), COSTGUARD_CLOUD="none", HF_HUB_OFFLINE="1",
                        TRANSFORMERS_VERBOSITY="error")  # fmt: skip
        env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
        expected = reference(trainer, Path(tmp), env)
        for number in range(trials):
            folder = Path(tmp, f"trial-{number}")
            folder.mkdir()
            url = (
                sys.argv[4] + f"/trial-{seed}-{number}"
                if len(sys.argv) > 4
                else str(folder / "store")
            )
            record = trial(trainer, url, folder, env, rng)
            record["equal"] = (folder / "final.pt").exists() and same_weights(
                folder / "final.pt", expected
            )
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
