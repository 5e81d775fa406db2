"""What a run costs on a SLURM allocation: GPU-hours counted in service units (SU), in
dollars only when the user says what an SU is worth, set against the cheapest cloud
option. Pure: no I/O.

>>> request = EstimateRequest(gpu="A100", hours=Decimal(10), count=2)
>>> rate = SlurmRate(su_per_gpu_hour=Decimal(64), usd_per_su=Decimal("0.01"))
>>> option = slurm_option(request, rate)
>>> format_su(option.service_units), option.usd
('1,280', Decimal('12.80'))
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from costguard.errors import InputError
from costguard.money import format_usd
from costguard.pricing.estimate import CostOption, EstimateRequest


@dataclass(frozen=True)
class SlurmRate:
    """How a SLURM allocation counts GPU time, as the user's centre publishes it.

    Allocations (NSF ACCESS, university clusters) are granted and charged in service
    units (SU), not billed in dollars; ``usd_per_su`` converts only when the user says
    what an SU is worth to them (a cost-recovery rate, say).
    """

    su_per_gpu_hour: Decimal
    usd_per_su: Decimal | None = None
    su_budget: Decimal | None = None

    def __post_init__(self) -> None:
        if not self.su_per_gpu_hour > 0:
            msg = f"--su-per-gpu-hour must be more than 0, not {self.su_per_gpu_hour}"
            raise InputError(msg, hint="your centre's charge for one GPU for one hour, e.g. 32")
        if self.usd_per_su is not None and self.usd_per_su < 0:
            msg = f"--usd-per-su must not be negative, not {self.usd_per_su}"
            raise InputError(msg, hint="leave it out when the allocation is not billed")
        if self.su_budget is not None and not self.su_budget > 0:
            msg = f"--su-budget must be more than 0, not {self.su_budget}"
            raise InputError(msg, hint="the service units left in your allocation, e.g. 50000")


@dataclass(frozen=True)
class SlurmOption:
    """A run on a SLURM allocation: GPU-hours counted in service units."""

    accelerator: str | None
    gpus: int
    hours: Decimal
    rate: SlurmRate
    #: ``--count``: nodes of one job (``slurm script --nodes``) or runs of a sweep (``--array``).
    nodes: int = 1

    @property
    def gpu_hours(self) -> Decimal:
        """GPUs x hours: what the allocation is charged for."""
        return self.hours * self.gpus

    @property
    def service_units(self) -> Decimal:
        """GPU-hours x SU per GPU-hour."""
        return self.gpu_hours * self.rate.su_per_gpu_hour

    @property
    def usd(self) -> Decimal | None:
        """The SUs in dollars, only when the user gave ``usd_per_su``; else not billed."""
        if self.rate.usd_per_su is None:
            return None
        return self.service_units * self.rate.usd_per_su

    @property
    def budget_share(self) -> Decimal | None:
        """The fraction of ``su_budget`` the run uses (more than 1: it does not fit)."""
        if self.rate.su_budget is None:
            return None
        return self.service_units / self.rate.su_budget

    @property
    def within_budget(self) -> bool | None:
        """Whether the run fits the SUs left; ``None`` without a budget."""
        share = self.budget_share
        return None if share is None else share <= 1


def slurm_option(request: EstimateRequest, rate: SlurmRate) -> SlurmOption:
    """The same GPUs and hours as ``request``, on a SLURM allocation.

    ``count`` instances of ``gpus_per_instance`` GPUs become as many GPUs on the cluster.

    >>> request = EstimateRequest(gpu="A10G", hours=Decimal(8), count=4)
    >>> option = slurm_option(request, SlurmRate(su_per_gpu_hour=Decimal(32)))
    >>> option.gpu_hours, option.service_units, option.usd
    (Decimal('32'), Decimal('1024'), None)
    """
    if request.gpu is None:
        msg = "--provider slurm counts GPU-hours: it needs --gpu"
        raise InputError(
            msg, hint="e.g. --gpu a100 --hours 8 --provider slurm --su-per-gpu-hour 32"
        )
    return SlurmOption(
        accelerator=request.gpu,
        gpus=request.count * request.gpus_per_instance,
        hours=request.hours,
        rate=rate,
        nodes=request.count,
    )


def slurm_assumptions(option: SlurmOption) -> tuple[str, ...]:
    """What the SLURM figure assumes, in words, next to the cloud assumptions."""
    rate = option.rate
    lines = [
        f"SLURM: service units = {option.gpus} GPU(s) x {option.hours} h x "
        f"{rate.su_per_gpu_hour} SU per GPU-hour (--su-per-gpu-hour, your centre's rate; "
        "some also charge CPU cores or memory, or weigh GPU types differently)",
    ]
    if option.nodes > 1:
        lines.append(
            f"SLURM: {option.gpus} GPU(s) = {option.nodes} x {option.gpus // option.nodes} "
            "GPU(s) (--count nodes of one job, or array tasks of a sweep, x "
            "--gpus-per-instance), each for the full --hours"
        )
    if rate.usd_per_su is None:
        lines.append(
            "SLURM: an allocation, not billed: the SUs come out of a grant (e.g. NSF "
            "ACCESS); --usd-per-su gives them a dollar value to compare"
        )
    else:
        lines.append(
            f"SLURM: dollars = SUs x {format_usd(rate.usd_per_su, rate=True)} per SU "
            "(--usd-per-su, your figure, not a price list)"
        )
    lines.append("SLURM: queue waits, storage and data transfer on the cluster are not counted")
    return tuple(lines)


def format_su(amount: Decimal) -> str:
    """Service units for people: thousands separated, at most two decimals.

    >>> format_su(Decimal("1024")), format_su(Decimal("1234.5678"))
    ('1,024', '1,234.57')
    """
    shown = amount.quantize(Decimal("0.01"))
    text = f"{shown:,.2f}"
    return text[:-3] if text.endswith(".00") else text


def slurm_comparison(slurm: SlurmOption, cheapest: CostOption | None) -> str:
    """One sentence setting the allocation against the cheapest cloud option."""
    units = f"{format_su(slurm.service_units)} SU"
    if cheapest is None:
        return f"The SLURM run uses {units}"
    cloud = (
        f"the cheapest cloud option ({cheapest.provider} {cheapest.region} "
        f"{cheapest.instance_type} {cheapest.market}) costs {format_usd(cheapest.total_usd)}"
    )
    if slurm.usd is None:
        return f"The SLURM run uses {units} of the allocation (not billed); {cloud}"
    difference = cheapest.total_usd - slurm.usd
    verdict = (
        f"{format_usd(difference)} less than the cloud"
        if difference > 0
        else f"{format_usd(-difference)} more than the cloud"
        if difference < 0
        else "the same as the cloud"
    )
    return f"The SLURM run uses {units}, worth {format_usd(slurm.usd)} ({verdict}); {cloud}"
