"""The order in which every arm sends a load point's requests: drawn once from the seed.

File order can group a workload by category (all code-editing prompts, then all chat),
so a point cut short by --duration would measure one category only, and an arm that
got further would measure another mix. `seeded_order` shuffles each category with the
seed, then deals the categories round-robin in a seeded category order, so any prefix
covers every category in proportion, and every arm sees the same list.

Worked example, seed 0: a file [c1, c2, c3, m1, m2, m3] (c: code, m: math) becomes
e.g. [m2, c3, m1, c1, m3, c2]: categories alternate, their members in a seeded order.

Turns of one multi-turn session (bench/load/sessions.py) stay in turn order: after the
shuffle, the places a session holds are given its turns in turn order.
"""

import random

from specwise.bench.inputs.request import WorkloadRequest

ORDERS = ("seeded", "file")


def seeded_order(workload: list[WorkloadRequest], seed: int) -> list[WorkloadRequest]:
    rng = random.Random(f"order:{seed}")
    groups: dict[str, list[WorkloadRequest]] = {}
    for request in workload:
        groups.setdefault(request.category, []).append(request)
    names = sorted(groups)
    rng.shuffle(names)
    for name in names:
        rng.shuffle(groups[name])
    ordered = []
    for index in range(max((len(group) for group in groups.values()), default=0)):
        ordered.extend(groups[name][index] for name in names if index < len(groups[name]))
    return _turns_in_order(ordered)


def _turns_in_order(ordered: list[WorkloadRequest]) -> list[WorkloadRequest]:
    places: dict[str, list[int]] = {}
    for index, request in enumerate(ordered):
        session = request.extra.get("session")
        if isinstance(session, str) and isinstance(request.extra.get("turn"), int):
            places.setdefault(session, []).append(index)
    for indexes in places.values():
        turns = sorted((ordered[index] for index in indexes), key=lambda request: request.extra["turn"])
        for index, request in zip(indexes, turns):
            ordered[index] = request
    return ordered
