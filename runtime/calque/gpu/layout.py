"""MIG layout files: named configs of per-device MIG settings (in the spirit of mig-parted's ``mig-configs``).

Example::

    version: 1
    mig-configs:
      all-disabled:
        - devices: all
          mig-enabled: false
      balanced:
        - devices: all                 # all | an index | a list of indices
          device-filter: A100-40GB     # optional: catalog key, NVML name or PCI id (or a list)
          mig-enabled: true
          mig-devices: {3g.20gb: 1, 2g.10gb: 1, 1g.5gb: 2}
          compute-instances: {3g.20gb: [1, 2]}   # optional: split each 3g GI into 1c + 2c

Unknown fields are refused; the file carries a version.

NVIDIA mig-parted's own files (``version: v1``, https://github.com/NVIDIA/mig-parted, ``api/spec/v1``)
are read as they are: the same ``mig-configs`` / ``devices`` / ``device-filter`` (PCI device ids such
as ``0x20B010DE``) / ``mig-enabled`` / ``mig-devices`` fields, and mig-parted's compute-instance keys
(``"1c.3g.20gb": 6``: 1-slice compute instances packed into 3g.20gb GPU instances, so two GIs of
three) become calque's ``compute-instances``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from calque.configfile import load_model
from calque.errors import UsageError, format_validation_error
from calque.gpu.catalog import Card, load_catalog
from calque.models import GpuDevice
from calque.models.base import CalqueModel
from calque.models.versions import check_version_number

LAYOUT_VERSION = 1
MIG_PARTED_VERSION = "v1"
# mig-parted's name for a compute instance inside a GPU instance: <C>c.<G>g.<memory>[+attributes]
_CI_KEY = re.compile(r"(\d+)c\.((\d+)g\..+)")


def _from_mig_parted_ci_keys(devices: dict[str, Any], split: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``{"1c.3g.20gb": 6}`` -> ``{"3g.20gb": 2}`` and ``{"3g.20gb": [1, 1, 1]}``.

    mig-parted creates each listed compute instance in the last GPU instance of that profile until
    it is full, then starts a new one; calque splits every GI of a profile the same way, so the
    count must fill whole GIs and one profile takes one CI size.
    """
    out: dict[str, Any] = {}
    ci: dict[str, Any] = dict(split)
    for key, n in devices.items():
        m = _CI_KEY.fullmatch(str(key))
        if m is None:
            out[key] = n
            continue
        c, gi_name, g = int(m.group(1)), m.group(2), int(m.group(3))
        if not isinstance(n, int) or n < 0 or c < 1 or c > g:
            raise ValueError(f"{key}: {n!r} is not a count of {c}-slice compute instances in a {gi_name}")
        per_gi = g // c
        if n % per_gi:
            raise ValueError(
                f"{key}: {n} compute instances of {c} slices do not fill whole {gi_name} instances "
                f"({per_gi} per instance); give a multiple of {per_gi} or use compute-instances"
            )
        if gi_name in ci or gi_name in devices:
            raise ValueError(f"{key}: {gi_name} is also given another way; give each GPU-instance profile once")
        out[gi_name] = n // per_gi
        ci[gi_name] = [c] * per_gi
    return out, ci


class LayoutEntry(CalqueModel):
    """MIG settings for the devices it selects."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=True)

    devices: Literal["all"] | int | list[int] = "all"
    device_filter: list[str] | None = Field(None, alias="device-filter")
    mig_enabled: bool = Field(alias="mig-enabled")
    mig_devices: dict[str, int] = Field(default_factory=dict, alias="mig-devices")
    compute_instances: dict[str, list[int]] = Field(default_factory=dict, alias="compute-instances")

    @model_validator(mode="before")
    @classmethod
    def _mig_parted(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        devices = data.get("mig-devices", data.get("mig_devices"))
        if isinstance(devices, dict) and any(_CI_KEY.fullmatch(str(k)) for k in devices):
            split = data.get("compute-instances", data.get("compute_instances")) or {}
            mig, ci = _from_mig_parted_ci_keys(devices, split if isinstance(split, dict) else {})
            data = {k: v for k, v in data.items() if k not in ("mig_devices", "compute_instances")}
            data["mig-devices"], data["compute-instances"] = mig, ci
        if data.get("mig-enabled", data.get("mig_enabled")) is False and any(n for n in (devices or {}).values()):
            raise ValueError("mig-devices are given but mig-enabled is false; remove them or enable MIG")
        return data

    @field_validator("device_filter", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("mig_devices")
    @classmethod
    def _positive(cls, v: dict[str, int]) -> dict[str, int]:
        bad = [k for k, n in v.items() if n < 0]
        if bad:
            raise ValueError(f"counts must be >= 0 (got {', '.join(bad)})")
        return {k: n for k, n in v.items() if n}

    def indexes(self) -> list[int]:
        """The GPU indexes the entry names (none for ``all``)."""
        if self.devices == "all":
            return []
        return [self.devices] if isinstance(self.devices, int) else list(self.devices)

    def selects(self, gpu: GpuDevice, card: Card | None, pci_id: str | None = None) -> bool:
        if self.devices != "all":
            wanted = [self.devices] if isinstance(self.devices, int) else self.devices
            if gpu.index not in wanted:
                return False
        if self.device_filter:
            names = {gpu.name.lower(), (gpu.card or "").lower(), (pci_id or "").lower()}
            if card is not None:
                names |= {
                    card.key.lower(),
                    *(n.lower() for n in card.nvml_names),
                    *(p.lower() for p in card.pci_device_ids),
                }
            return any(f.lower() in names for f in self.device_filter)
        return True


class LayoutFile(CalqueModel):
    """A versioned file of named MIG configs."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=True)

    version: int | str = Field(description=f"{LAYOUT_VERSION} (calque) or {MIG_PARTED_VERSION!r} (mig-parted)")
    mig_configs: dict[str, list[LayoutEntry]] = Field(alias="mig-configs")

    @field_validator("version")
    @classmethod
    def _known(cls, v: int | str) -> int | str:
        if v == MIG_PARTED_VERSION:
            return v
        if not isinstance(v, int):
            raise ValueError(
                f"layout version {v!r} is not supported; this runtime reads version {LAYOUT_VERSION} "
                f"(calque) and version {MIG_PARTED_VERSION} (NVIDIA mig-parted)"
            )
        check_version_number("layout", v, LAYOUT_VERSION, "upgrade calque on this host, or write an older layout")
        return v

    def select(self, name: str | None) -> tuple[str, list[LayoutEntry]]:
        if name is None:
            if len(self.mig_configs) != 1:
                raise UsageError(f"choose a config with --select; this file has: {', '.join(self.mig_configs)}")
            name = next(iter(self.mig_configs))
        if name not in self.mig_configs:
            hint = ""
            if name.lower() in ("true", "false"):
                # Ansible and YAML 1.1 turn an unquoted on/off/yes/no into a boolean before calque sees it
                hint = "; YAML read an unquoted on/off/yes/no as a boolean: quote the name (select: 'off')"
            raise UsageError(f"no config {name!r} in the layout file; it has: {', '.join(self.mig_configs)}{hint}")
        return name, self.mig_configs[name]


def parse_entries(data: Any) -> list[LayoutEntry]:
    """An inline layout (a list of entries, as the module's ``layout`` option takes)."""
    if not isinstance(data, list):
        raise UsageError("a layout is a list of entries, each with mig-enabled and optionally devices and mig-devices")
    try:
        return [LayoutEntry.model_validate(e) for e in data]
    except ValidationError as exc:
        raise UsageError(format_validation_error(exc, "invalid layout")) from exc


def load_layout(path: Path | str) -> LayoutFile:
    return load_model(LayoutFile, path, "layout file")


def card_of(gpu: GpuDevice) -> Card | None:
    cat = load_catalog()
    return cat.cards.get(gpu.card or "") or cat.find_card(gpu.name)
