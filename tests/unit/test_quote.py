"""The estimate API (`costguard.pricing.quote`): the whole answer of `costguard estimate`
as values, without the command line, and a question checked when it is made."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from costguard.cli.render import to_jsonable
from costguard.errors import BudgetExceededError, InputError
from costguard.pricing.question import Question
from costguard.pricing.quote import quote
from costguard.pricing.tables import load_catalog

D = Decimal

#: (the command's arguments, the same question as typed values)
ASKED = [
    ("--gpu a10g --hours 8 --count 4", Question(hours=D(8), gpus=("a10g",), count=4)),
    (
        "--gpu l4,t4 --hours 10 --region us-east-1 --budget 50",
        Question(hours=D(10), gpus=("l4,t4",), regions=("us-east-1",), budget=D(50)),
    ),
    (
        "--gpu a100 --gpus-per-instance 8 --hours 24 --provider slurm --provider aws "
        "--su-per-gpu-hour 64 --usd-per-su 0.02 --su-budget 50000",
        Question(
            hours=D(24),
            gpus=("a100",),
            gpus_per_instance=8,
            providers=("slurm", "aws"),
            su_per_gpu_hour=D(64),
            usd_per_su=D("0.02"),
            su_budget=D(50000),
        ),
    ),
    (
        "--gpu t4 --hours 10 --interruptions-per-day 2 --every-minutes 20",
        Question(hours=D(10), gpus=("t4",), interruptions_per_day=D(2), every_minutes=D(20)),
    ),
    (
        "--gpu t4 --hours 10 --spot --interruptions-per-day advisor --region us-east-1 "
        "--region us-central1 --top 0",
        Question(
            hours=D(10),
            gpus=("t4",),
            spot=True,
            interruptions_per_day="advisor",
            regions=("us-east-1", "us-central1"),
            top=0,
        ),
    ),
]


@pytest.mark.parametrize(("args", "question"), ASKED)
def test_the_api_gives_the_commands_json_document(
    run_cli: Callable[..., Any], args: str, question: Question
) -> None:
    printed = run_cli("estimate", *args.split(), "--format", "json")
    assert printed.exit_code == 0, printed.stderr
    document = quote(question, load_catalog()).document()
    assert json.loads(json.dumps(to_jsonable(document))) == printed.json()


def test_the_api_gives_the_commands_csv_rows(run_cli: Callable[..., Any]) -> None:
    args = ("--gpu", "a100", "--hours", "24", "--provider", "slurm", "--su-per-gpu-hour", "64")
    printed = run_cli("estimate", *args, "--format", "csv")
    question = Question(hours=D(24), gpus=("a100",), providers=("slurm",), su_per_gpu_hour=D(64))
    columns, rows = quote(question, load_catalog()).records()
    lines = printed.stdout.splitlines()
    assert lines[0] == ",".join(columns)
    assert len(lines) == 1 + len(rows)
    assert lines[-1].startswith("slurm,allocation,")


def test_a_budget_too_small_is_an_error_value_the_caller_raises() -> None:
    catalog = load_catalog()
    fits = quote(Question(hours=D(8), gpus=("a10g",), budget=D(10_000)), catalog)
    assert fits.budget_error() is None
    over = quote(Question(hours=D(8), gpus=("a10g",), budget=D(1)), catalog)
    error = over.budget_error()
    assert isinstance(error, BudgetExceededError)
    assert "over the budget of $1.00" in error.message


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"hours": D(0)}, "hours: must be more than 0"),
        ({"hours": D("1e9")}, "must be at most 87840 hours"),
        ({"hours": D("NaN")}, "hours: is not a finite number"),
        ({"hours": D(8), "count": 0}, "count must be a whole number from 1"),
        ({"hours": D(8), "disk_gb": D(-1)}, "disk_gb: must be at least 0"),
        ({}, "the run's length is missing"),
        ({"hours": D(8), "su_budget": D(5)}, "--su-budget is for SLURM allocations"),
        ({"hours": D(8), "providers": ("slurm",)}, "--provider slurm needs --su-per-gpu-hour"),
        ({"hours": D(8), "every_minutes": D(5)}, "--every-minutes prices spot preemptions"),
        ({"hours": D(8), "interruptions_per_day": D(1), "spot": False}, "--on-demand"),
        ({"hours": D(8), "steps": 10}, "--steps is for --from-run"),
        ({"hours": D(8), "from_run": "/tmp/run"}, "--hours and --from-run both"),
        ({"from_run": "/tmp/run", "gpus": ("l4,t4",)}, "--from-run prices one GPU"),
    ],
)
def test_a_bad_question_is_refused_when_it_is_made(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(InputError) as info:
        Question(**fields)
    assert says in info.value.message
    assert info.value.hint


def test_the_estimate_api_and_the_notebook_need_no_click() -> None:
    code = (
        "import sys, costguard\n"
        "from costguard.errors import InputError\n"
        "from decimal import Decimal\n"
        "from costguard.pricing.question import Question\n"
        "from costguard.pricing.quote import quote\n"
        "from costguard.pricing.tables import load_catalog\n"
        "quote(Question(hours=Decimal(8), gpus=('a10g',)), load_catalog()).document()\n"
        "try:\n"
        "    costguard.estimate(gpu='a10g', hours=0)\n"
        "except InputError:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m == 'click' or m.startswith('costguard.cli')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
