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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator

from calque.configfile import load_model
from calque.errors import UsageError, format_validation_error
from calque.gpu.catalog import Card, load_catalog
from calque.models import GpuDevice
from calque.models.base import CalqueModel, check_version_number

LAYOUT_VERSION = 1


class LayoutEntry(CalqueModel):
    """MIG settings for the devices it selects."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=True)

    devices: Literal["all"] | int | list[int] = "all"
    device_filter: list[str] | None = Field(None, alias="device-filter")
    mig_enabled: bool = Field(alias="mig-enabled")
    mig_devices: dict[str, int] = Field(default_factory=dict, alias="mig-devices")
    compute_instances: dict[str, list[int]] = Field(default_factory=dict, alias="compute-instances")

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

    version: int
    mig_configs: dict[str, list[LayoutEntry]] = Field(alias="mig-configs")

    @field_validator("version")
    @classmethod
    def _known(cls, v: int) -> int:
        check_version_number("layout", v, LAYOUT_VERSION, "upgrade calque on this host, or write an older layout")
        return v

    def select(self, name: str | None) -> tuple[str, list[LayoutEntry]]:
        if name is None:
            if len(self.mig_configs) != 1:
                raise UsageError(f"choose a config with --select; this file has: {', '.join(self.mig_configs)}")
            name = next(iter(self.mig_configs))
        if name not in self.mig_configs:
            raise UsageError(f"no config {name!r} in the layout file; it has: {', '.join(self.mig_configs)}")
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
