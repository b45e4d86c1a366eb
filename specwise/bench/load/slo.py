"""Service-level objectives for goodput: `--slo ttft=500ms,tpot=50ms,e2e=10s`.

Values are seconds; an `ms` or `s` suffix is accepted. A request meets the SLO when it
completed and each given bound holds (TPOT is vacuous for single-token outputs).
"""

from dataclasses import asdict, dataclass

from specwise.bench.load.metrics import request_tpot
from specwise.bench.results import RequestRecord
from specwise.errors import ConfigError

KEYS = ("ttft", "tpot", "e2e")


@dataclass
class SLO:
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def given(self) -> bool:
        return any(value is not None for value in asdict(self).values())

    def met_by(self, record: RequestRecord) -> bool:
        if record.error or record.ttft is None:
            return False
        tpot = request_tpot(record)
        return ((self.ttft is None or record.ttft <= self.ttft)
                and (self.tpot is None or tpot is None or tpot <= self.tpot)
                and (self.e2e is None or (record.e2e is not None and record.e2e <= self.e2e)))

    def to_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}

    @classmethod
    def from_dict(cls, data: dict | None) -> "SLO":
        return cls(**{key: data[key] for key in KEYS if data and data.get(key) is not None})


def parse_slo(text: str | None) -> SLO:
    """`"ttft=0.5,tpot=50ms"` -> SLO(ttft=0.5, tpot=0.05)."""
    slo = SLO()
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, _, raw = part.partition("=")
        key = key.strip().lower()
        if key not in KEYS or not raw.strip():
            raise ConfigError(f"--slo: expected KEY=VALUE with KEY in {', '.join(KEYS)}, got {part.strip()!r}")
        setattr(slo, key, _seconds(raw.strip(), key))
    return slo


def _seconds(raw: str, key: str) -> float:
    scale = 1.0
    if raw.endswith("ms"):
        raw, scale = raw[:-2], 1e-3
    elif raw.endswith("s"):
        raw = raw[:-1]
    try:
        value = float(raw) * scale
    except ValueError:
        raise ConfigError(f"--slo {key}: {raw!r} is not a number of seconds (or ms)") from None
    if not value > 0:
        raise ConfigError(f"--slo {key} must be > 0, got {raw!r}")
    return value
