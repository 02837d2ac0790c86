"""The long fuzzing campaign: ``python -m tests.fuzz.run_long [JOBS CLUSTERS HOSTFILES]``.

Runs the generators of :mod:`tests.fuzz.specgen` (default 10,000 job files, 5,000
cluster files, 2,000 hostfiles) and prints how many cases ended in a traceback,
exit 3, a hang, garbage accepted or any other violation, with the time taken.
Exits 1 when any case broke the property.
"""

from __future__ import annotations

import collections
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.fuzz import specgen


def campaign(kind: str, examples: int, root: Path, seed_value: int) -> collections.Counter[str]:
    strategy = {
        "job": specgen.job_cases(),
        "cluster": specgen.cluster_cases(),
        "hostfile": specgen.hostfile_cases(),
    }[kind]
    counts: collections.Counter[str] = collections.Counter()

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(case: specgen.Case) -> None:
        counts["cases"] += 1
        counts[f"expected {case.verdict}"] += 1
        problems = specgen.check(case, root)
        for problem in problems:
            counts[problem.split(":")[0]] += 1
            print(f"  {kind}: {specgen.describe_failure(case, [problem])[:400]}", flush=True)

    run()
    return counts


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [10_000, 5_000, 2_000]
    total = 0
    for kind, examples in zip(("job", "cluster", "hostfile"), sizes, strict=False):
        start = time.monotonic()
        with tempfile.TemporaryDirectory() as root:
            counts = campaign(kind, examples, Path(root), seed_value=2026)
        bad = sum(v for k, v in counts.items() if k != "cases" and not k.startswith("expected"))
        total += bad
        named = ("traceback", "exit 3", "hang", "garbage accepted")
        other = bad - sum(counts[k] for k in named)
        found = ", ".join(f"{k} {counts[k]}" for k in named)
        expected = "/".join(str(counts[f"expected {v}"]) for v in ("ok", "bad", "any"))
        print(
            f"{kind}: {counts['cases']} files in {time.monotonic() - start:.0f} s; {found}, "
            f"other violations {other}; expected ok/bad/any {expected}",
            flush=True,
        )
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
