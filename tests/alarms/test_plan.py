"""The pure side of `costguard alarm`: validation, diffs, provider limits."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costguard.alarms.plan_aws import ObservedAws, ObservedAwsBudget, plan_aws
from costguard.alarms.plan_azure import ObservedAzureBudget, plan_azure
from costguard.alarms.plan_gcp import ObservedGcpBudget, plan_gcp
from costguard.alarms.spec import LIMITS, AlarmSpec, Basis, Notification, alarm_spec
from costguard.errors import InputError

ACCOUNT = "111122223333"


def spec(**kwargs) -> AlarmSpec:
    return alarm_spec(**{"budget": "200", "emails": ["me@uni.edu"], **kwargs})


def test_spec_defaults() -> None:
    made = spec()
    assert made.name == "costguard-monthly"
    assert made.budget_usd == Decimal(200)
    assert made.notifications[-1] == Notification(Basis.FORECASTED, Decimal(100))
    assert made.thresholds == (Decimal(50), Decimal(80), Decimal(100))


def test_thresholds_sorted_and_deduplicated() -> None:
    assert spec(thresholds="90, 50,90,12.5").thresholds == (
        Decimal("12.5"),
        Decimal(50),
        Decimal(90),
    )


def test_aws_fresh_plan_order() -> None:
    plan = plan_aws(spec(), ObservedAws(account_id=ACCOUNT))
    assert [str(c) for c in plan.calls] == [
        "sns.create_topic",
        "sns.set_topic_attributes",
        "sns.subscribe",
        "budgets.create_budget",
        "cloudwatch.put_metric_alarm",
    ]


def in_place(made: AlarmSpec) -> ObservedAws:
    topic = f"arn:aws:sns:us-east-1:{ACCOUNT}:costguard-budget-alerts"
    subscribers = frozenset({("EMAIL", e) for e in made.emails} | {("SNS", topic)})
    return ObservedAws(
        account_id=ACCOUNT,
        budget=ObservedAwsBudget(
            made.budget_usd,
            "MONTHLY",
            frozenset(made.notifications),
            dict.fromkeys(made.notifications, subscribers),
        ),
        topic_exists=True,
        topic_policy_allows_budgets=True,
        topic_email_subscriptions=frozenset(made.emails),
        alarm_threshold_usd=made.budget_usd,
        alarm_actions=(topic,),
    )


def test_aws_in_place_plan_is_empty() -> None:
    made = spec()
    assert plan_aws(made, in_place(made)).calls == ()


def test_aws_subscriber_diff() -> None:
    old = spec()
    new = spec(emails=["me@uni.edu", "pi@uni.edu"])
    plan = plan_aws(new, in_place(old))
    ops = [str(c) for c in plan.calls]
    assert ops.count("budgets.create_subscriber") == len(new.notifications)
    assert "sns.subscribe" in ops
    assert "budgets.update_budget" not in ops


def test_aws_daily_budget_is_recreated_monthly() -> None:
    made = spec()
    observed = in_place(made)
    assert observed.budget is not None
    daily = ObservedAws(
        **{
            **observed.__dict__,
            "budget": ObservedAwsBudget(made.budget_usd, "DAILY", observed.budget.notifications),
        }
    )
    plan = plan_aws(made, daily)
    assert [str(c) for c in plan.calls] == ["budgets.delete_budget", "budgets.create_budget"]


def test_gcp_amount_in_units_and_nanos() -> None:
    made = alarm_spec(budget="199.99", provider="gcp", billing_account="012345-6789ab-cdef01")
    (call,) = plan_gcp(made, None, []).calls
    money = call.params["budget"]["amount"]["specified_amount"]
    assert (money["units"], money["nanos"]) == (199, 990_000_000)
    assert call.params["parent"] == "billingAccounts/012345-6789AB-CDEF01"


def test_azure_plan_upserts_once_and_is_idempotent() -> None:
    made = alarm_spec(budget="200", provider="azure", subscription="sub", emails=["a@b.edu"])
    (call,) = plan_azure(made, None, "2026-12-01T00:00:00Z").calls
    assert call.params["scope"] == "/subscriptions/sub"
    same = ObservedAzureBudget(
        Decimal(200), "Monthly", frozenset(made.notifications), frozenset(made.emails)
    )
    assert plan_azure(made, same, "2026-12-01T00:00:00Z").calls == ()


budgets = st.one_of(
    st.decimals(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["0", "-1", "abc", "", "1e10", "200", "0.01", "999999999.99"]),
)
emails = st.lists(
    st.sampled_from(["a@b.edu", "x@y.org", "bad", "c@d.io", "e@f.com"]) | st.emails().map(str),
    max_size=60,
)
thresholds = st.lists(
    st.decimals(min_value=-10, max_value=2000, places=1, allow_nan=False), min_size=0, max_size=14
).map(lambda xs: ",".join(str(x) for x in xs))


@settings(max_examples=300, deadline=None)
@given(
    budget=budgets,
    addresses=emails,
    percents=thresholds,
    forecast=st.booleans(),
    provider=st.sampled_from(["aws", "gcp", "azure"]),
)
def test_planned_notifications_respect_provider_limits(
    budget, addresses, percents, forecast, provider
) -> None:
    try:
        made = alarm_spec(
            budget=budget,
            emails=addresses,
            thresholds=percents,
            forecast=forecast,
            provider=provider,
            billing_account="012345-6789AB-CDEF01",
            subscription="sub",
            project="p",
        )
    except InputError as exc:
        refused: InputError | None = exc
    else:
        refused = None
    if refused is not None:
        assert refused.exit_code == 2
        assert refused.hint
        return
    limits = LIMITS[provider]
    assert 0 < made.budget_usd <= Decimal(10) ** 9
    assert len(made.notifications) <= limits["notifications"]
    assert len(made.emails) <= limits["emails"]
    assert all(0 < n.threshold_percent <= 1000 for n in made.notifications)
    if provider == "aws":
        (create,) = [
            c
            for c in plan_aws(made, ObservedAws(account_id=ACCOUNT)).calls
            if c.operation == "create_budget"
        ]
        assert create.params["Budget"]["TimeUnit"] == "MONTHLY"  # FORECASTED needs it
        entries = create.params["NotificationsWithSubscribers"]
        assert len(entries) <= 10
        for entry in entries:
            kinds = [s["SubscriptionType"] for s in entry["Subscribers"]]
            assert kinds.count("EMAIL") <= 10
            assert kinds.count("SNS") == 1
    elif provider == "gcp":
        (create,) = plan_gcp(made, None, [f"c{i}" for i in range(len(made.emails))]).calls
        rule = create.params["budget"].get("notifications_rule", {})
        assert len(rule.get("monitoring_notification_channels", [])) <= 5
    else:
        (upsert,) = plan_azure(made, None, "2026-12-01T00:00:00Z").calls
        assert len(upsert.params["parameters"]["properties"]["notifications"]) <= 5


@pytest.mark.parametrize("bad", ["a b@c.de", "@x.org", "me@host", "me@@x.org"])
def test_email_typos_rejected(bad: str) -> None:
    with pytest.raises(InputError, match="not an email"):
        spec(emails=[bad])


# ------------------------------------------ the services' own rules (issue 19)


def test_gcp_currency_is_never_assumed() -> None:
    """specified_amount.currency_code must match the billing account (create) or the
    budget (update): it is the account's when known, left out when not, and a plan in
    another currency than USD says so."""
    made = alarm_spec(budget="200", provider="gcp", billing_account="012345-6789ab-cdef01")
    unknown = plan_gcp(made, None, [])
    (call,) = unknown.calls
    assert "currency_code" not in call.params["budget"]["amount"]["specified_amount"]
    assert "could not be read" in unknown.notes[0]
    euro = plan_gcp(made, None, [], currency="EUR")
    assert euro.calls[0].params["budget"]["amount"]["specified_amount"]["currency_code"] == "EUR"
    assert "EUR" in euro.notes[0]
    assert plan_gcp(made, None, [], currency="USD").notes == ()
    existing = ObservedGcpBudget("billingAccounts/x/budgets/1", Decimal(100),
                                 frozenset(made.notifications), currency="JPY")  # fmt: skip
    (update,) = plan_gcp(made, existing, [], currency="EUR").calls
    assert update.params["budget"]["amount"]["specified_amount"]["currency_code"] == "JPY"


def test_gcp_project_filter_compares_numbers() -> None:
    made = alarm_spec(budget="200", provider="gcp", billing_account="012345-6789ab-cdef01",
                      project="thesis-1")  # fmt: skip
    existing = ObservedGcpBudget("billingAccounts/x/budgets/1", Decimal(200),
                                 frozenset(made.notifications), projects=("projects/42",),
                                 currency="USD")  # fmt: skip
    assert plan_gcp(made, existing, [], projects=["projects/42"]).calls == ()
    assert plan_gcp(made, existing, []).calls  # by id: differs, so it would update


def test_gcp_budget_names_fit_in_60_characters() -> None:
    assert len(alarm_spec(budget="200", provider="gcp", billing_account="012345-6789ab-cdef01",
                          name="n" * 50).name) == 60  # fmt: skip
    with pytest.raises(InputError, match="gcp allows 60") as caught:
        alarm_spec(
            budget="200", provider="gcp", billing_account="012345-6789ab-cdef01", name="n" * 51
        )
    assert caught.value.hint
    assert len(alarm_spec(budget="200", provider="aws", name="n" * 63).name) == 73


def test_azure_update_keeps_the_budgets_time_period() -> None:
    made = alarm_spec(budget="300", provider="azure", subscription="sub", emails=["a@b.edu"])
    existing = ObservedAzureBudget(Decimal(200), "Monthly", frozenset(made.notifications),
                                   frozenset(made.emails), start_date="2026-11-01T00:00:00Z",
                                   end_date="2036-10-31T00:00:00Z")  # fmt: skip
    (call,) = plan_azure(made, existing, "2026-12-01T00:00:00Z").calls
    period = call.params["parameters"]["properties"]["timePeriod"]
    assert period == {"startDate": "2026-11-01T00:00:00Z", "endDate": "2036-10-31T00:00:00Z"}
    (fresh,) = plan_azure(made, None, "2026-12-01T00:00:00Z").calls
    assert fresh.params["parameters"]["properties"]["timePeriod"] == {
        "startDate": "2026-12-01T00:00:00Z"
    }
