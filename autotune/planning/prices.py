"""GPU prices, from the user only (docs/sizing.md#4-prices): autotune ships none, because a
price is a contract, not a fact about the hardware.

``--price H100-80GB=2.49`` (repeatable, or comma-separated) and a ``--prices FILE`` (YAML,
``prices: {H100-80GB: 2.49}``) give US dollars, or any one currency, per GPU-hour. Names are
hardware profile names (case ignored); a flag overrides the file. Bad input is one line
naming the flag, or the file, line and field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from autotune.config import ConfigModel, read_config_text
from autotune.config.loading import parse_document
from autotune.errors import ConfigError, ProfileError
from autotune.profiles.hardware import get_hardware

__all__ = ["Prices", "PricesFile", "merge_prices", "parse_price_flags", "read_prices"]

# per GPU-hour, by hardware profile name as the profile spells it
Prices = Mapping[str, float]


def _canonical(name: str) -> str:
    return get_hardware(name.strip()).name


def _price(value: float, what: str) -> float:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{what}: a price per GPU-hour must be a positive number, got {value}")
    return float(value)


class PricesFile(ConfigModel):
    """A ``--prices`` file: one price per GPU-hour per hardware profile name."""

    # gt=0 per entry: a bad price's error names its own line
    prices: dict[str, Annotated[float, Field(gt=0)]] = Field(min_length=1)

    @field_validator("prices")
    @classmethod
    def _known(cls, v: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, price in v.items():
            try:
                key = _canonical(name)
            except ProfileError as exc:
                raise ValueError(str(exc)) from None
            out[key] = float(price)
        return out


def read_prices(path: str | Path) -> dict[str, float]:
    """The prices of a ``--prices`` file; one error line naming its line and field."""
    text = read_config_text(path)
    return dict(parse_document(text, str(path), PricesFile).prices)


def parse_price_flags(flags: Iterable[str]) -> dict[str, float]:
    """``--price NAME=PRICE`` values (each may hold several, comma-separated)."""
    out: dict[str, float] = {}
    for flag in flags:
        for item in (p.strip() for p in flag.split(",")):
            if not item:
                continue
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise ConfigError(f"--price {item!r}: write HARDWARE=PRICE, e.g. H100-80GB=2.49")
            try:
                key = _canonical(name)
                out[key] = _price(float(value), name.strip())
            except ProfileError as exc:
                raise ConfigError(f"--price {item!r}: {exc}") from None
            except ValueError as exc:
                why = str(exc) if "price per GPU-hour" in str(exc) else "the price is not a number"
                raise ConfigError(f"--price {item!r}: {why}") from None
    return out


def merge_prices(file_prices: Prices | None, flag_prices: Prices) -> dict[str, float]:
    """The file's prices with the flags' over them."""
    return {**(file_prices or {}), **flag_prices}
