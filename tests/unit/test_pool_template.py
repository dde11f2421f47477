"""A pool's launch template version: what its digest covers, the TTL it carries, when its URLs are renewed."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from calque.aws.acquire import group as grp
from calque.aws.acquire import template as tpl


def inputs(user_data: str, **kw: object) -> tpl.TemplateInputs:
    base: dict[str, object] = {
        "image_id": "ami-1",
        "root_device": "/dev/xvda",
        "instance_type": "g6.xlarge",
        "user_data": user_data,
        "volume_size_gib": 100,
        "volume_type": "gp3",
        "kms_key_id": None,
        "instance_profile": "p",
        "security_groups": [],
        "key_name": None,
        "tags": {"calque:pool": "lab-a/x"},
    }
    base.update(kw)
    return tpl.TemplateInputs(**base)  # type: ignore[arg-type]


def signed(date: str) -> str:
    return f"RUNTIME_URL='http://127.0.0.1:1/b/w.whl?X-Amz-Date={date}&X-Amz-Expires=604800&X-Amz-Signature=ab'\n"


def test_a_fresh_signature_alone_keeps_the_digest_but_the_wheel_or_ami_changes_it() -> None:
    _, a = tpl.template_data(inputs(signed("20261201T000000Z")))
    _, b = tpl.template_data(inputs(signed("20261202T000000Z")))
    _, c = tpl.template_data(inputs(signed("20261201T000000Z").replace("w.whl", "v.whl")))
    _, d = tpl.template_data(inputs(signed("20261201T000000Z"), image_id="ami-2"))
    assert a == b and len({a, c, d}) == 3


def test_the_template_is_hardened_and_tags_instances_with_their_config() -> None:
    data, digest = tpl.template_data(inputs("#!/bin/sh\n"))
    assert data["MetadataOptions"] == {
        "HttpTokens": "required",
        "HttpPutResponseHopLimit": 2,
        "HttpEndpoint": "enabled",
    }
    assert data["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True
    instance_tags = {t["Key"]: t["Value"] for t in data["TagSpecifications"][0]["Tags"]}
    assert instance_tags == {"calque:pool": "lab-a/x", "calque:config": digest}


def test_a_short_ttl_is_a_relative_poweroff_and_a_day_or_more_is_the_groups_lifetime() -> None:
    text = tpl.group_user_data(3600, "#!/bin/sh\necho hi\n")
    assert "+ 3600 ))" in text and "expires-epoch" in text  # counted from the first boot, not from now
    assert "calque TTL" not in tpl.group_user_data(None, "#!/bin/sh\n")
    shape = grp.GroupShape(0, 2, ["g6.xlarge"], ["subnet-1"], 0, True, 2 * 86400)
    params = grp.group_params("g", shape, "lt-1", 3)
    assert params["MaxInstanceLifetime"] == 172800 and params["CapacityRebalance"] is True
    assert (
        params["MixedInstancesPolicy"]["InstancesDistribution"]["SpotAllocationStrategy"] == "price-capacity-optimized"
    )
    assert "MaxInstanceLifetime" not in grp.group_params(
        "g", grp.GroupShape(0, 2, ["g6.xlarge"], [], 0, False, None), "lt", 1
    )


def test_urls_are_renewed_once_half_their_validity_is_gone() -> None:
    text = signed("20261201T000000Z")
    expires = tpl.urls_expire(text)
    assert expires == datetime(2026, 12, 8, tzinfo=timezone.utc)
    state = tpl.TemplateState("lt-1", 1, "d", expires)
    week = tpl.urls_valid_for(text)
    assert week == timedelta(days=7)
    assert not tpl.needs_renewal(state, now=datetime(2026, 12, 3, tzinfo=timezone.utc), issued_for=week)
    assert tpl.needs_renewal(state, now=datetime(2026, 12, 5, tzinfo=timezone.utc), issued_for=week)
