"""Speculative decoding counters and the three acceptance figures: the one definition.

A "draft" is one verification step of one sequence that carried at least one
draft token; steps without drafts are not counted. From the counters:

  - acceptance rate          = accepted tokens / draft tokens
  - mean acceptance length   = 1 + accepted tokens / drafts
                               (tokens emitted per draft, the recovered or bonus token included)
  - per-position acceptance  = accepted at position i / drafts, for i = 0 .. longest k - 1
                               (a draft shorter than i + 1 counts as not accepted at i)

Each figure is None, never NaN, while its denominator is 0.

Worked example: three drafts of k = 4 tokens accept 4, 1 and 0 tokens.
    drafts = 3, draft tokens = 12, accepted tokens = 5
    accepted per position = [2, 1, 1, 1]   (position 0 accepted in the first two drafts, ...)
    acceptance rate          = 5 / 12    = 0.417
    mean acceptance length   = 1 + 5 / 3 = 2.667  (the drafts emitted 5 + 2 + 1 = 8 tokens)
    per-position acceptance  = [0.667, 0.333, 0.333, 0.333]  (sums to mean length - 1)

The same dataclass counts one request (in its RequestOutput) and the whole
engine (merge of all requests), and carries the seconds spent drafting and
verifying, which only the engine-wide copy fills in.
"""

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    drafts: int = 0                # verification steps that carried at least one draft token
    draft_tokens: int = 0          # draft tokens proposed
    accepted_tokens: int = 0       # draft tokens accepted
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: drafts that accepted position i
    drafting_seconds: float = 0.0  # wall time in proposers
    verifying_seconds: float = 0.0  # wall time in verification steps (target forward + rejection sampling)

    def __post_init__(self):
        counts = {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                  "drafting_seconds": self.drafting_seconds, "verifying_seconds": self.verifying_seconds}
        for name, value in counts.items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.accepted_tokens > self.draft_tokens:
            raise ValueError(f"accepted_tokens ({self.accepted_tokens}) exceeds draft_tokens ({self.draft_tokens})")
        if sum(self.accepted_per_position) != self.accepted_tokens:
            raise ValueError(f"accepted_per_position sums to {sum(self.accepted_per_position)}, "
                             f"not accepted_tokens ({self.accepted_tokens})")
        if any(count > self.drafts for count in self.accepted_per_position):
            raise ValueError(f"a position was accepted more often than there were drafts ({self.drafts})")
        # position i is accepted only after positions 0 .. i-1 were
        if any(later > earlier for earlier, later in zip(self.accepted_per_position, self.accepted_per_position[1:])):
            raise ValueError(f"accepted_per_position must not increase, got {self.accepted_per_position}")

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """Count one verification step of one sequence; a step with no draft tokens is not a draft."""
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(f"need 0 <= num_accepted <= num_drafted, got {num_accepted} of {num_drafted}")
        if num_drafted == 0:
            return
        self.drafts += 1
        self.draft_tokens += num_drafted
        self.accepted_tokens += num_accepted
        self._grow_positions(num_drafted)
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1

    def merge(self, other: "SpecStats") -> "SpecStats":
        """A new SpecStats counting both (positions aligned from 0)."""
        longest = max(len(self.accepted_per_position), len(other.accepted_per_position))
        mine = self.accepted_per_position + [0] * (longest - len(self.accepted_per_position))
        theirs = other.accepted_per_position + [0] * (longest - len(other.accepted_per_position))
        return SpecStats(drafts=self.drafts + other.drafts,
                         draft_tokens=self.draft_tokens + other.draft_tokens,
                         accepted_tokens=self.accepted_tokens + other.accepted_tokens,
                         accepted_per_position=[a + b for a, b in zip(mine, theirs)],
                         drafting_seconds=self.drafting_seconds + other.drafting_seconds,
                         verifying_seconds=self.verifying_seconds + other.verifying_seconds)

    def copy(self) -> "SpecStats":
        """A snapshot that later `record` calls on self do not change."""
        return self.merge(SpecStats())

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted_tokens / self.drafts if self.drafts else None

    @property
    def per_position_acceptance(self) -> list[float] | None:
        if not self.drafts:
            return None
        return [count / self.drafts for count in self.accepted_per_position]

    def to_dict(self) -> dict:
        """Counters and the three figures, for JSON results and reports."""
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "accepted_per_position": list(self.accepted_per_position),
                "drafting_seconds": self.drafting_seconds, "verifying_seconds": self.verifying_seconds,
                "acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length,
                "per_position_acceptance": self.per_position_acceptance}

    def _grow_positions(self, num_positions: int) -> None:
        missing = num_positions - len(self.accepted_per_position)
        if missing > 0:
            self.accepted_per_position.extend([0] * missing)
