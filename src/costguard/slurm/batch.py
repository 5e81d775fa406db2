"""The batch script for a preempt-safe SLURM job. Pure, apart from reading the template.

The script and every check on what reaches it are kept side by side, so that no value
reaches the shell or an ``#SBATCH`` line unchecked.

:func:`render` fills the template (``infra/slurm/costguard-job.sbatch``, shipped in the
wheel as ``costguard/_slurm``) from a validated :class:`BatchJob`. Every value that
reaches the shell is quoted with :func:`shlex.quote`; every value that reaches an
``#SBATCH`` line is checked against SLURM's own syntax first, so a typo fails here (exit 2)
rather than in the queue hours later.

>>> job = BatchJob.build(command=["python", "train.py"], checkpoint="s3://b/run1",
...                      time="08:00:00", mem="64G", gpus=1, requeue=True)
>>> [line for line in sbatch_lines(job) if "signal" in line or "gres" in line]
['#SBATCH --gres=gpu:1', '#SBATCH --signal=B:USR1@120']

Three shapes share the template, through its ``{{launch}}`` field: one process (the
command under ``costguard run``); ``--nodes N``, one ``torchrun`` per node started by
``srun``, meeting at the first node (c10d rendezvous), each under its own ``costguard
run``; and ``--container``, the command (or each node's ``torchrun``) inside
``apptainer exec``. ``--array`` gives every array task its own checkpoint folder,
``<checkpoint>/task-<SLURM_ARRAY_TASK_ID>``.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from costguard import contract
from costguard._version import __version__
from costguard.errors import CostguardError, InputError
from costguard.gang import check_node_command, torchrun_args
from costguard.secrets import find_in_words, find_secret, redact_url, url_has_credentials

#: How long before the time limit SLURM sends USR1, unless told: room for an emergency
#: save plus SLURM's own slack (it may signal up to a minute early, never late).
DEFAULT_SIGNAL_LEAD_S = 120
#: SLURM stores the lead in 16 bits.
MAX_SIGNAL_LEAD_S = 65535
DEFAULT_MAX_REQUEUES = 10
MAX_TIME_LIMIT_S = 365 * 24 * 3600
TEMPLATE_NAME = "costguard-job.sbatch"

# Matched whole (fullmatch): ``$`` would let a trailing newline through, and a newline in
# an #SBATCH line ends the header, so SLURM ignores every option after it.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
_NAMES = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(,[A-Za-z0-9][A-Za-z0-9._-]*)*", re.ASCII)
_MEM = re.compile(r"([0-9]+)([KMGT]?)", re.IGNORECASE | re.ASCII)
#: A SLURM ``--array`` spec: indexes and ranges (with an optional ``:step``), comma
#: separated, and an optional ``%limit`` on the tasks that run at once (sbatch(1)).
_ARRAY = re.compile(r"[0-9]+(-[0-9]+(:[0-9]+)?)?(,[0-9]+(-[0-9]+(:[0-9]+)?)?)*(%[0-9]+)?", re.ASCII)
_ARRAY_HINT = "SLURM's forms: 0-9, 1,3,5, 0-99:10, 0-99%8 (at most 8 at once)"
#: SLURM's largest MaxArraySize is 4000001, so an index is at most 4000000 (slurm.conf(5)).
MAX_ARRAY_INDEX = contract.MAX_ARRAY_INDEX
#: The rendezvous port when none is given: 29500 (torchrun's default) plus the job id
#: modulo 10000, so two jobs sharing a first node rarely meet at the same port.
DEFAULT_RDZV_PORT = "$((29500 + SLURM_JOB_ID % 10000))"
_TIME_HINT = "SLURM's forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. --time 08:00:00"


def parse_time_limit(text: str) -> int:
    """A SLURM ``--time`` value in seconds; :class:`InputError` when it is not one.

    >>> [parse_time_limit(t) for t in ("90", "5:30", "08:00:00", "1-12", "2-0:30", "1-0:0:1")]
    [5400, 330, 28800, 129600, 174600, 86401]
    >>> parse_time_limit("8h")
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: --time '8h' is not a SLURM time limit
    """
    value = text.strip()
    days = 0
    rest = value
    if "-" in value:
        day_text, rest = value.split("-", 1)
        days = _number(day_text, text)
        parts = [_number(p, text) for p in rest.split(":")]
        if len(parts) > 3:
            raise _bad_time(text)
        hours, minutes, seconds = (*parts, 0, 0)[:3]
    else:
        parts = [_number(p, text) for p in rest.split(":")]
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        elif len(parts) == 3:
            hours, minutes, seconds = parts
        else:
            raise _bad_time(text)
    clock = "-" in value or len(parts) == 3  # hours given: minutes below 60
    if seconds > 59 or (clock and minutes > 59) or (days and hours > 23):
        raise _bad_time(text)
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        msg = f"--time {text!r} must be longer than 0"
        raise InputError(msg, hint=_TIME_HINT)
    if total > MAX_TIME_LIMIT_S:
        msg = f"--time {text!r} is more than a year"
        raise InputError(msg, hint=_TIME_HINT)
    return total


def _number(part: str, text: str) -> int:
    if not part.isdigit() or not part.isascii():
        raise _bad_time(text)
    return int(part)


def _bad_time(text: str) -> InputError:
    return InputError(f"--time {text!r} is not a SLURM time limit", hint=_TIME_HINT)


def format_time_limit(seconds: int) -> str:
    """``D-HH:MM:SS`` (days only when there are any), the form ``sbatch`` prints.

    >>> format_time_limit(28800), format_time_limit(90061)
    ('08:00:00', '1-01:01:01')
    """
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def parse_mem(text: str) -> str:
    """A SLURM ``--mem`` value, normalised (upper-case unit); plain numbers are MB.

    >>> parse_mem("64g"), parse_mem("4096")
    ('64G', '4096')
    """
    match = _MEM.fullmatch(text)
    if not match:
        msg = f"--mem {text!r} is not a SLURM memory size"
        raise InputError(
            msg, hint="a whole number with K, M, G or T (plain numbers are MB), e.g. 64G"
        )
    return f"{int(match.group(1))}{match.group(2).upper()}"


def parse_array(text: str) -> str:
    """A SLURM ``--array`` spec, checked: ranges that go up, steps and limits above 0.

    >>> parse_array("0-9"), parse_array("1,3,5-7:2%2")
    ('0-9', '1,3,5-7:2%2')
    >>> parse_array("9-0")
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: --array '9-0' is not a SLURM array: 9-0 goes down
    """
    value = text.strip()
    if not _ARRAY.fullmatch(value):
        msg = f"--array {text!r} is not a SLURM array"
        raise InputError(msg, hint=_ARRAY_HINT)
    ranges, _, limit = value.partition("%")
    if limit and int(limit) == 0:
        msg = f"--array {text!r} is not a SLURM array: the %limit must be 1 or more"
        raise InputError(msg, hint=_ARRAY_HINT)
    for part in ranges.split(","):
        span, _, step = part.partition(":")
        first, _, last = span.partition("-")
        if last and int(last) < int(first):
            msg = f"--array {text!r} is not a SLURM array: {span} goes down"
            raise InputError(msg, hint=_ARRAY_HINT)
        if step and int(step) == 0:
            msg = f"--array {text!r} is not a SLURM array: the :step must be 1 or more"
            raise InputError(msg, hint=_ARRAY_HINT)
        if int(last or first) > MAX_ARRAY_INDEX:
            msg = f"--array {text!r} is not a SLURM array: {last or first} is too large"
            raise InputError(msg, hint=f"indexes go from 0 to {MAX_ARRAY_INDEX}")
    return value


def _plain_text(flag: str, value: str, hint: str) -> str:
    """``value`` stripped, refused when empty or holding a control character (a newline
    would end the shell line it is written on)."""
    text = value.strip()
    if not text or any(ord(c) < 32 or ord(c) == 127 for c in text):
        what = "is empty" if not text else "holds a newline or control character"
        msg = f"{flag} {value[:200]!r} {what}"
        raise InputError(msg, hint=hint)
    return text


def parse_index_url(text: str) -> str:
    """A package mirror for pip: ``http(s)://`` without credentials (those go in the
    site's pip.conf or netrc, never in a batch script that is logged and shared).

    >>> parse_index_url("https://pypi.example.edu/simple/")
    'https://pypi.example.edu/simple/'
    """
    hint = "the mirror's simple index, e.g. --index-url https://pypi.example.edu/simple/"
    value = _plain_text("--index-url", text, hint)
    if not re.match(r"^https?://[^/\s]+", value) or any(c.isspace() for c in value):
        msg = f"--index-url {redact_url(value)[:200]!r} is not an http(s) URL"
        raise InputError(msg, hint=hint)
    if url_has_credentials(value):
        msg = f"--index-url {redact_url(value)[:200]!r} carries a user name, password or query"
        raise InputError(msg, hint="put the credentials in pip.conf or ~/.netrc on the cluster")
    return value


@dataclass(frozen=True)
class BatchJob:
    """A validated request for one batch script; build it with :meth:`build`."""

    command: tuple[str, ...]
    checkpoint: str
    time_limit_s: int
    signal_lead_s: int = DEFAULT_SIGNAL_LEAD_S
    gpus: int = 1
    gpu_type: str | None = None
    mem: str | None = None
    cpus_per_task: int | None = None
    partition: str | None = None
    account: str | None = None
    job_name: str = "costguard"
    requeue: bool = False
    max_requeues: int = DEFAULT_MAX_REQUEUES
    costguard: tuple[str, ...] = ("costguard",)
    run_options: tuple[str, ...] = ()
    #: Multi-node: one ``torchrun`` per node (None: the command runs as given, once).
    nodes: int | None = None
    procs_per_node: int = 1
    rdzv_port: int | None = None
    torchrun: tuple[str, ...] = ("torchrun",)
    array: str | None = None
    container: str | None = None
    index_url: str | None = None

    @classmethod
    def build(
        cls,
        *,
        command: Sequence[str],
        checkpoint: str,
        time: str,
        signal_lead_s: int = DEFAULT_SIGNAL_LEAD_S,
        gpus: int = 1,
        gpu_type: str | None = None,
        mem: str | None = None,
        cpus_per_task: int | None = None,
        partition: str | None = None,
        account: str | None = None,
        job_name: str = "costguard",
        requeue: bool = False,
        max_requeues: int = DEFAULT_MAX_REQUEUES,
        costguard: str = "costguard",
        run_options: Sequence[str] = (),
        nodes: int | None = None,
        procs_per_node: int | None = None,
        rdzv_port: int | None = None,
        torchrun: str = "torchrun",
        array: str | None = None,
        container: str | None = None,
        index_url: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> BatchJob:
        """Check every field against SLURM's syntax; :class:`InputError` names the bad one.

        A credential (:mod:`costguard.secrets`: a token's shape, or the value of a
        credential-like variable of ``environ``, default this process's environment) in the
        command, the checkpoint URL or the costguard command is refused too: the script is
        a file others can read, and sbatch passes the environment on by itself."""
        if not command or not command[0].strip():
            msg = "no command to run"
            raise InputError(msg, hint="put it after --, e.g. -- pixi run python train.py")
        if not checkpoint.strip():
            msg = "--checkpoint is empty"
            raise InputError(msg, hint="a folder on a shared file system, or s3://bucket/run1")
        time_limit_s = parse_time_limit(time)
        if not 1 <= signal_lead_s <= MAX_SIGNAL_LEAD_S:
            msg = f"--signal-lead {signal_lead_s} is out of range"
            raise InputError(msg, hint=f"seconds, from 1 to {MAX_SIGNAL_LEAD_S}, e.g. 120")
        if signal_lead_s >= time_limit_s:
            msg = (
                f"--signal-lead {signal_lead_s} s is not shorter than the time limit "
                f"({format_time_limit(time_limit_s)})"
            )
            raise InputError(msg, hint="a longer --time or a shorter --signal-lead")
        if gpus < 0:
            msg = f"--gpus {gpus} is negative"
            raise InputError(msg, hint="0 for a CPU partition, else the GPUs per node, e.g. 1")
        for flag, value, pattern in (
            ("--gpu-type", gpu_type, _NAME),
            ("--partition", partition, _NAMES),
            ("--account", account, _NAME),
            ("--job-name", job_name, _NAME),
        ):
            if value is not None and not pattern.fullmatch(value):
                msg = f"{flag} {value!r} is not a SLURM name"
                raise InputError(msg, hint="letters, digits, '.', '_' and '-' only")
        if gpu_type is not None and gpus == 0:
            msg = "--gpu-type needs --gpus 1 or more"
            raise InputError(msg, hint="drop --gpu-type for a CPU job")
        if max_requeues < 0:
            msg = f"--max-requeues {max_requeues} is negative"
            raise InputError(msg, hint="e.g. --max-requeues 10")
        prefix = _words("--costguard", costguard)
        if any(not word.isprintable() for word in prefix):
            msg = "--costguard is not a command line (a control character?)"
            raise InputError(msg, hint="e.g. --costguard 'pixi run costguard'")
        if not prefix:
            msg = "--costguard is empty"
            raise InputError(msg, hint="the command that starts costguard on the nodes")
        procs = _processes(nodes, procs_per_node, gpus, rdzv_port)
        launcher = _words("--torchrun", _plain_text("--torchrun", torchrun, "e.g. torchrun"))
        shipped = {"--costguard": prefix, "--torchrun": launcher, "--container": [container or ""]}
        shipped |= {  # names go into #SBATCH lines; a token fits their characters
            flag: [value or ""]
            for flag, value in (
                ("--job-name", job_name),
                ("--partition", partition),
                ("--account", account),
                ("--gpu-type", gpu_type),
            )
        }
        _refuse_secrets(command, checkpoint, shipped, run_options, environ)
        if nodes is not None:
            check_node_command(command)
        image = None
        if container is not None:
            image = _plain_text("--container", container, "an Apptainer image, e.g. image.sif")
        return cls(
            command=tuple(command),
            checkpoint=checkpoint,
            time_limit_s=time_limit_s,
            signal_lead_s=signal_lead_s,
            gpus=gpus,
            gpu_type=gpu_type,
            mem=parse_mem(mem) if mem is not None else None,
            cpus_per_task=cpus_per_task,
            partition=partition,
            account=account,
            job_name=job_name,
            requeue=requeue,
            max_requeues=max_requeues if requeue else 0,
            costguard=tuple(prefix),
            run_options=tuple(run_options),
            nodes=nodes,
            procs_per_node=procs,
            rdzv_port=rdzv_port,
            torchrun=tuple(launcher),
            array=parse_array(array) if array is not None else None,
            container=image,
            index_url=parse_index_url(index_url) if index_url is not None else None,
        )


def _refuse_secrets(
    command: Sequence[str],
    checkpoint: str,
    shipped: Mapping[str, Sequence[str]],
    run_options: Sequence[str],
    environ: Mapping[str, str] | None,
) -> None:
    """Refuse a credential in anything the batch script carries: the command, the
    checkpoint URL, the ``shipped`` options (flag -> its words) and costguard's options."""
    places = {"--checkpoint": [checkpoint]} | {flag: list(w) for flag, w in shipped.items()}
    places |= {f"argument {n} of the command": [w] for n, w in enumerate(command, start=1)}
    places["the costguard run options"] = list(run_options)
    in_command = find_in_words(command)  # a value after its flag: --wandb-key 0123...
    found = find_secret(places, os.environ if environ is None else environ) or (
        in_command and (f"argument {in_command[0] + 1} of the command", in_command[1])
    )
    if found:
        place, what = found
        msg = f"{place} carries {what}, which would be written into the batch script"
        raise InputError(msg, hint="let the job read it from its environment (sbatch passes it on)")


def _words(flag: str, text: str) -> list[str]:
    """``text`` split into words as the shell would; :class:`InputError` if it cannot be."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        msg = f"{flag} {text[:200]!r} cannot be split into words: {exc}"
        raise InputError(msg, hint="quote it as for the shell, e.g. 'pixi run costguard'") from None


def _processes(
    nodes: int | None, procs_per_node: int | None, gpus: int, rdzv_port: int | None
) -> int:
    """The processes per node torchrun starts: ``procs_per_node``, else one per GPU."""
    if nodes is None:
        for flag, value in (("--procs-per-node", procs_per_node), ("--rdzv-port", rdzv_port)):
            if value is not None:
                msg = f"{flag} is for multi-node jobs, and --nodes is not given"
                raise InputError(msg, hint=f"add --nodes N (1 or more), or drop {flag}")
        return 1
    if nodes < 1:
        msg = f"--nodes {nodes} must be 1 or more"
        raise InputError(msg, hint="the number of nodes, e.g. --nodes 2")
    if procs_per_node is not None and procs_per_node < 1:
        msg = f"--procs-per-node {procs_per_node} must be 1 or more"
        raise InputError(msg, hint="processes per node, usually one per GPU")
    if rdzv_port is not None and not 1024 <= rdzv_port <= 65535:
        msg = f"--rdzv-port {rdzv_port} is out of range"
        raise InputError(msg, hint="a port from 1024 to 65535, e.g. 29500")
    if procs_per_node is None and gpus == 0:
        msg = "--nodes with --gpus-per-node 0 needs --procs-per-node"
        raise InputError(msg, hint="e.g. --procs-per-node 4 for four CPU processes per node")
    return procs_per_node if procs_per_node is not None else gpus


def sbatch_lines(job: BatchJob) -> list[str]:
    """The ``#SBATCH`` lines, in a fixed order.

    ``--open-mode=append`` keeps the log of earlier allocations when the job is requeued.
    The GPU request is left out for ``gpus=0`` (a CPU partition may have no GRES at all).
    """
    options = [f"--job-name={job.job_name}"]
    if job.partition:
        options.append(f"--partition={job.partition}")
    if job.account:
        options.append(f"--account={job.account}")
    options.append(f"--time={format_time_limit(job.time_limit_s)}")
    if job.nodes is not None:
        # One task per node: its torchrun starts that node's processes.
        options += [f"--nodes={job.nodes}", "--ntasks-per-node=1"]
    if job.array is not None:
        options.append(f"--array={job.array}")
    if job.mem:
        options.append(f"--mem={job.mem}")
    if job.cpus_per_task:
        options.append(f"--cpus-per-task={job.cpus_per_task}")
    if job.gpus:
        kind = f"{job.gpu_type}:" if job.gpu_type else ""
        options.append(f"--gres=gpu:{kind}{job.gpus}")
    options.append(f"--signal=B:USR1@{job.signal_lead_s}")
    if job.requeue:
        options.append("--requeue")
    options.append("--open-mode=append")
    return [f"#SBATCH {option}" for option in options]


def render(job: BatchJob, template: str) -> str:
    """The batch script: ``template`` with its ``{{name}}`` fields filled.

    >>> job = BatchJob.build(command=["python", "train.py", "--note", "it's"],
    ...                      checkpoint="/scratch/run 1", time="1:00:00", gpus=0)
    >>> print(render(job, "{{costguard_run}} -- {{command}}"))
    costguard run --signals relay --checkpoint '/scratch/run 1' -- python train.py --note 'it'"'"'s'
    """
    # --signals relay: USR1/TERM reach the script as notices through costguard run's pipe,
    # which waits for the Checkpointer even while the script is still importing torch; a
    # forwarded USR1 would kill a script whose handler is not installed yet.
    run = [*job.costguard, "run", "--signals", "relay", "--checkpoint", job.checkpoint]
    run += job.run_options
    costguard_run = shlex.join(run)
    if job.array is not None:
        # Each array task its own folder; only the shell knows the task's index.
        checkpoint = f"--checkpoint {shlex.quote(job.checkpoint)}"
        task = f'{shlex.quote(job.checkpoint.rstrip("/") + "/task-")}"$SLURM_ARRAY_TASK_ID"'
        costguard_run = costguard_run.replace(checkpoint, f"--checkpoint {task}", 1)
    fields = {
        "sbatch_lines": "\n".join(sbatch_lines(job)),
        "version": __version__,
        "signal_lead_s": str(job.signal_lead_s),
        "max_requeues": str(job.max_requeues),
        "costguard_run": costguard_run,
        "command": shlex.join(job.command),
        "launch": launch_lines(job),
    }

    def fill(match: re.Match[str]) -> str:
        return fields[match.group(1)]

    unknown = set(re.findall(r"\{\{(\w+)\}\}", template)) - set(fields)
    if unknown:
        msg = f"the batch-script template has unknown fields: {', '.join(sorted(unknown))}"
        raise CostguardError(msg, hint="reinstall costguard")
    return re.sub(r"\{\{(\w+)\}\}", fill, template)


def launch_lines(job: BatchJob) -> str:
    """The shell lines that start the job in the background (``child`` is its pid)."""
    lines = []
    if job.index_url is not None:
        lines += [
            "# The site's package mirror for pip and uv, so nothing needs the public index",
            "# (pixi reads its own: the manifest's index-url, config.toml's mirrors).",
            f"export PIP_INDEX_URL={shlex.quote(job.index_url)}",
            'export UV_DEFAULT_INDEX="$PIP_INDEX_URL"',
        ]
    inner = ""
    if job.container is not None:
        # The checkpoint folder is bound in when it is a local one; Apptainer binds the
        # home folder, /tmp (costguard run's notice file) and the current folder itself.
        local = "://" not in job.checkpoint
        binds = ["--bind", job.checkpoint] if local else []
        apptainer = ["apptainer", "exec", *(["--nv"] if job.gpus else []), *binds, job.container]
        if local:
            lines.append(
                f"mkdir -p {shlex.quote(job.checkpoint)}  # Apptainer binds only folders that exist"
            )
        lines.append(f"container=({shlex.join(apptainer)})")
        inner = ' "${container[@]}"'
    if job.nodes is None:
        lines.append(f'"${{costguard_run[@]}}" --{inner} "${{command[@]}}" &')
        return "\n".join(lines)
    port = str(job.rdzv_port) if job.rdzv_port is not None else DEFAULT_RDZV_PORT
    torchrun = torchrun_args(job.torchrun, job.nodes, job.procs_per_node)
    lines += [
        "# One torchrun per node (srun: one task per node), each under its own costguard run;",
        "# they meet at the first node of the allocation (c10d rendezvous). A notice on any",
        "# node reaches every rank: the ranks agree on notices at each step.",
        'rdzv_host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"rdzv_port={port}",
        f"torchrun=({shlex.join(torchrun)}",
        '    --rdzv-endpoint "$rdzv_host:$rdzv_port" --rdzv-id "$SLURM_JOB_ID")',
        f"srun --nodes={job.nodes} --ntasks-per-node=1 --kill-on-bad-exit=0 \\",
        f'    "${{costguard_run[@]}}" --{inner} "${{torchrun[@]}}" "${{command[@]}}" &',
    ]
    return "\n".join(lines)


def template_path() -> Path:
    """The bundled template: ``costguard/_slurm`` in a wheel, ``infra/slurm`` in a checkout."""
    packaged = Path(str(resources.files("costguard"))) / "_slurm" / TEMPLATE_NAME
    if packaged.is_file():
        return packaged
    checkout = Path(__file__).resolve().parents[3] / "infra" / "slurm" / TEMPLATE_NAME
    if checkout.is_file():
        return checkout
    msg = "the SLURM batch-script template is missing from this installation of costguard"
    raise CostguardError(msg, hint="reinstall it: pip install --force-reinstall . in its checkout")


def batch_script(job: BatchJob) -> str:
    """The batch script for ``job``, from the bundled template."""
    return render(job, template_path().read_text(encoding="utf-8"))
