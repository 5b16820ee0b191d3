"""The chip table (chips.toml): the one place that knows Snapdragon SoCs."""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

from toolchain.errors import SpecError
from toolchain.spec.table import Table

TABLE = Path(__file__).with_name("chips.toml")
CHIP_ID = re.compile(r"^[A-Z0-9]+$")


class ChipRecord(TypedDict):
    """Chip.record(): what of a chip reaches a compiler, in every per-chip task's settings and
    its step's kwargs."""
    name: str
    soc_model: int
    htp_arch: int
    vtcm_mb: int
    fp16: bool
    qairt: NotRequired[str]   # only for a QAIRT family other than the build's own


@dataclass(frozen=True)
class Chip:
    """One SoC of chips.toml (and, for another QAIRT family's build, that family)."""

    name: str
    soc_model: int        # QNN soc id, as the bundled SDK numbers it
    htp_arch: int         # Hexagon arch the SDK assigns to that soc id
    vtcm_mb: int
    fp16: bool            # float graphs compile with relaxed (fp16) precision
    default: bool         # built when a model lists no chips of its own
    marketing: str
    source: str           # where each value was verified
    # a QAIRT family other than the build's own (project.model_chips): its own tasks and paths
    family: str = ""

    @property
    def tag(self) -> str:
        """What task names say after '@': 'SM8750', or 'SM8750+qairt2.49' for another
        QAIRT family's build."""
        return f"{self.name}+qairt{self.family}" if self.family else self.name

    def record(self) -> ChipRecord:
        """The fields that reach the compiler (part of every per-chip task's settings); a
        non-default QAIRT family is one of them (the default's record stays as it was: nothing of
        today's build rebuilds)."""
        found = ChipRecord(
            name=self.name,
            soc_model=self.soc_model,
            htp_arch=self.htp_arch,
            vtcm_mb=self.vtcm_mb,
            fp16=self.fp16,
        )
        if self.family:
            found["qairt"] = self.family
        return found


def load(path: str | Path = TABLE) -> dict[str, Chip]:
    """Read and validate the chip table, keyed by chip name in file order."""
    data = tomllib.loads(Path(path).read_text())
    chips = {}
    for name in data:
        if not CHIP_ID.match(name):
            raise SpecError(f"{path}: [{name}]: chip names must match {CHIP_ID.pattern}")
        t = Table(data, str(path)).sub(name)
        chips[name] = Chip(
            name=name,
            soc_model=t.req("soc_model", int),
            htp_arch=t.req("htp_arch", int),
            vtcm_mb=t.req("vtcm_mb", int),
            fp16=t.req("fp16", bool),
            default=t.opt("default", bool, False),
            marketing=t.opt("marketing", str, ""),
            source=t.req("source", str),
        )
        t.done()
    ids = [c.soc_model for c in chips.values()]
    if len(set(ids)) != len(ids):
        raise SpecError(f"{path}: two chips share a soc_model id")
    return chips


def unknown(name: str, chips: dict[str, Chip]) -> str:
    """Why `name` is no chip of the table, and what to write instead: for a marketing
    name ("Snapdragon 8 Gen 2", which reports print) its SoC id, else the closest id,
    else the ids known."""
    import difflib  # for an error's suggestion only: not at every load
    by_marketing = {_plain(c.marketing): c.name for c in chips.values() if c.marketing}
    said = _plain(name)
    close = difflib.get_close_matches(said, by_marketing, n=1, cutoff=0.9)
    if said in by_marketing or close:
        chip = chips[by_marketing[said if said in by_marketing else close[0]]]
        return (
            f"unknown chip {name!r}; that is {chip.name}'s marketing name ({chip.marketing}): "
            "write "
            f'"{chip.name}" (chips are named by SoC id)'
        )
    ids = difflib.get_close_matches(str(name), chips, n=1)
    return f"unknown chip {name!r}; " + (
        f"did you mean '{ids[0]}'?" if ids else f"known chips: {', '.join(chips)}"
    )


def _plain(name: str) -> str:
    """A chip's marketing name as people write it: no case, spaces or maker ("snapdragon 8 gen
    2" -> "8gen2")."""
    return "".join(str(name).lower().replace("snapdragon", "").replace("qualcomm", "").split())
