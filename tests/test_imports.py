"""`import costguard` and `costguard estimate` must load no cloud SDK and no torch.

Checked in a fresh interpreter, the way click's own test suite checks its imports.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    "boto3",
    "botocore",
    "google",
    "azure",
    "torch",
    "pandas",
    "numpy",
    "fsspec",
    "matplotlib",
    "pyarrow",
)

PROBE = """
import json, sys
{body}
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
print(json.dumps(heavy))
"""


def loaded_heavy_modules(body: str) -> list[str]:
    code = PROBE.format(body=body, heavy=HEAVY)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe_lines(body: str) -> list[str]:
    """What the probe prints after running ``body``, line by line (the heavy modules last)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=body, heavy=HEAVY)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip().splitlines()


def test_probe_detects_a_heavy_import() -> None:
    # The probe must be able to fail: watch a stdlib module the body does import.
    code = PROBE.format(body="import sqlite3", heavy=("sqlite3",))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert "sqlite3" in json.loads(out.stdout.strip())


def test_import_costguard_is_light() -> None:
    assert loaded_heavy_modules("import costguard") == []


def test_estimate_command_is_light() -> None:
    body = (
        "import io, contextlib\n"
        "from costguard.cli import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    code = cli.main(['estimate', '--gpu', 'a10g', '--hours', '8', '--count', '4',\n"
        "                     '--format', 'json'], standalone_mode=False)\n"
        "assert code in (0, None), code\n"
    )
    assert loaded_heavy_modules(body) == []


def test_estimate_table_output_is_light() -> None:
    body = (
        "import io, contextlib\n"
        "from costguard.cli import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    cli.main(['estimate', '--gpu', 'h100', '--hours', '1'], standalone_mode=False)\n"
    )
    assert loaded_heavy_modules(body) == []


def test_the_notebook_api_loads_pandas_only_for_a_dataframe() -> None:
    body = (
        "import costguard\n"
        "result = costguard.estimate(gpu='a10g', hours=8, count=4)\n"
        "html = result._repr_html_()\n"
    )
    assert loaded_heavy_modules(body) == []
    assert "pandas" in loaded_heavy_modules(body + "result.to_pandas()\n")


#: What `costguard estimate` into a pipe (a script, cron) has no use for, each a cost on
#: every run (benchmarks/estimate.py): rich's console (plain output is echoed), difflib
#: (close-name suggestions, on errors only), importlib.resources and the tempfile, shutil
#: and archive modules it pulls in (the bundled tables are found by path), the
#: --data URL rules, and logging (the estimate logs nothing: the secret-masking log
#: set-up comes with the first costguard logger).
NOT_FOR_A_PIPED_ESTIMATE = (
    "rich.console",
    "difflib",
    "importlib.resources",
    "tempfile",
    "costguard.pricing.locate",
    "logging",
)


def test_a_piped_estimate_loads_only_what_it_prints_with() -> None:
    body = (
        "import io, contextlib\n"
        "from costguard.cli import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    cli.main(['estimate', '--gpu', 'a10g', '--hours', '8'], standalone_mode=False)\n"
        f"print(json.dumps(sorted(set({NOT_FOR_A_PIPED_ESTIMATE!r}) & set(sys.modules))))\n"
    )
    assert loaded_heavy_modules(body) == []
    assert json.loads(probe_lines(body)[-2]) == []


def test_a_price_table_as_a_dataframe_loads_no_command_line() -> None:
    # costguard.pricing.table() once borrowed the notebook's pandas import, and with it
    # click and the CLI's parameter types.
    body = (
        "import costguard\n"
        "costguard.pricing.table('regions')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'click'\n"
        "                        or m.startswith(('costguard.cli', 'costguard.notebook')))))\n"
    )
    assert json.loads(probe_lines(body)[-2]) == []


def test_the_version_is_read_from_its_own_module() -> None:
    # fsspec's habit: a module that needs the version imports costguard._version, not
    # the package front (the front imports it from there too).
    import ast
    from pathlib import Path

    import costguard
    from costguard._version import __version__

    assert costguard.__version__ == __version__
    source = Path(costguard.__file__).parent
    fronts = [
        str(path.relative_to(source))
        for path in source.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom)
        and node.module == "costguard"
        and any(alias.name == "__version__" for alias in node.names)
    ]
    assert fronts == []


#: What a plain `costguard estimate` into a pipe (no --interruptions-per-day, no
#: --provider slurm) does not print with: each was loaded on every run (shutil, with its
#: archive modules, for a terminal's width).
NOT_FOR_A_PLAIN_ESTIMATE = (
    "costguard.pricing.advisor",
    "costguard.pricing.interruptions",
    "costguard.pricing.slurm",
    "shutil",
)


def test_a_plain_estimate_loads_no_preemption_or_slurm_figures() -> None:
    body = (
        "import io, contextlib\n"
        "from costguard.cli import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    cli.main(['estimate', '--gpu', 'a10g', '--hours', '8'], standalone_mode=False)\n"
        f"print(json.dumps(sorted(set({NOT_FOR_A_PLAIN_ESTIMATE!r}) & set(sys.modules))))\n"
    )
    assert json.loads(probe_lines(body)[-2]) == []
