"""The spend gate, the consents and the quota preflight, against the moto server.

moto has no EC2 quotas in Service Quotas: that is the "cannot read, warn and continue" path. The
"quota too small" path answers GetServiceQuota from a hook registered on the test's client.
"""

from __future__ import annotations

from typing import Any

import pytest
from calque.aws.acquire import Acquirer, Consent
from calque.aws.clients import client
from calque.errors import InfrastructureError, RefusedError

from .capacity import CallCounter, ServiceQuotaValues

G_ON_DEMAND = "L-DB2E81BA"


def n_live(ec2: Any) -> int:
    res = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return sum(len(r["Instances"]) for r in res["Reservations"])


def test_launch_without_spend_consent_is_refused_with_exit_4(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    with pytest.raises(RefusedError) as err:
        acquirer.apply(spec_for(count=2), Consent())
    assert err.value.exit_code == 4
    # every way to consent, the inventory variable a play reads first
    assert "calque_i_understand_this_spends_money: true (inventory" in str(err.value)
    assert "i_understand_this_spends_money: true (module)" in str(err.value)
    assert "--i-understand-this-spends-money" in str(err.value)
    assert n_live(ec2) == 0


def test_over_max_hourly_usd_is_refused_showing_the_arithmetic(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    spec = spec_for(count=4, instance_types=["g6.xlarge", "g6e.xlarge"], max_hourly_usd=5.0)
    with pytest.raises(RefusedError) as err:
        acquirer.apply(spec, Consent(spend=True))
    # priced at the dearest candidate: 4 x 1.861 = 7.444 > 5.00
    assert "4 x g6e.xlarge at $1.8610/h = $7.44/h > max_hourly_usd $5.00/h" in str(err.value)
    assert n_live(ec2) == 0


def test_within_max_hourly_usd_launches(acquirer: Acquirer, spec_for: Any) -> None:
    result = acquirer.apply(spec_for(count=2, max_hourly_usd=2.0), Consent(spend=True))
    assert len(result.instances) == 2


def test_scale_down_and_release_need_terminate_consent(ec2: Any, acquirer: Acquirer, spec_for: Any) -> None:
    acquirer.apply(spec_for(count=3), Consent(spend=True))
    with pytest.raises(RefusedError, match=r"calque_i_understand_this_terminates_instances: true \(inventory"):
        acquirer.apply(spec_for(count=1), Consent(spend=True))
    with pytest.raises(RefusedError, match="would terminate 3 instance"):
        acquirer.release("lab-a", Consent(spend=True))
    assert n_live(ec2) == 3


def test_unreadable_quota_warns_and_continues(acquirer: Acquirer, spec_for: Any) -> None:
    result = acquirer.apply(spec_for(count=1), Consent(spend=True))
    assert len(result.instances) == 1
    assert any("could not read the EC2 quota" in w and G_ON_DEMAND in w for w in result.warnings)


def test_quota_too_small_fails_before_launching(ec2: Any, spec_for: Any) -> None:
    quotas = client("service-quotas")
    ServiceQuotaValues(quotas, {G_ON_DEMAND: 8})  # two g6.xlarge (4 vCPUs each)
    calls = CallCounter(ec2)
    acquirer = Acquirer(ec2=ec2, service_quotas=quotas, waiter_delay_s=1)
    with pytest.raises(InfrastructureError) as err:
        acquirer.apply(spec_for(count=4), Consent(spend=True))
    assert "quota too small" in str(err.value) and G_ON_DEMAND in str(err.value)
    assert "needs 4 more" in str(err.value) and "fit 2" in str(err.value)
    assert calls.calls["RunInstances"] == 0 and n_live(ec2) == 0


def test_quota_counts_what_is_already_running(ec2: Any, spec_for: Any) -> None:
    quotas = client("service-quotas")
    ServiceQuotaValues(quotas, {G_ON_DEMAND: 12})
    acquirer = Acquirer(ec2=ec2, service_quotas=quotas, waiter_delay_s=1)
    acquirer.apply(spec_for(name="other", count=2), Consent(spend=True))  # 8 of 12 vCPUs used
    with pytest.raises(InfrastructureError, match="8 in use"):
        acquirer.apply(spec_for(count=2), Consent(spend=True))
    ok = acquirer.apply(spec_for(count=2, min_viable=1), Consent(spend=True))
    assert any("fit 1 of the 2" in w for w in ok.warnings)


def test_quota_skips_a_type_too_big_for_it(ec2: Any, spec_for: Any) -> None:
    quotas = client("service-quotas")
    ServiceQuotaValues(quotas, {G_ON_DEMAND: 16})
    acquirer = Acquirer(ec2=ec2, service_quotas=quotas, waiter_delay_s=1)
    result = acquirer.apply(spec_for(count=2, instance_types=["g6e.12xlarge", "g6.xlarge"]), Consent(spend=True))
    assert [i.instance_type for i in result.instances] == ["g6.xlarge", "g6.xlarge"]
    assert any("skipping g6e.12xlarge" in w for w in result.warnings)
