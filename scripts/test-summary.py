#!/usr/bin/env python3
"""make test's last line: the tests of every stage (ctest's and pytest's JUnit reports) counted as
passed, failed and skipped, and why they were skipped, reasons that say the same thing said once.

    python3 scripts/test-summary.py REPORT.xml...   (a report that is not there is passed over)"""
import os
import re
import sys
import xml.etree.ElementTree as ET

# What a skip reason says, by the words in it: the first match names it.
REASONS = [
    (re.compile(r"third-party|test data|testdata|test shards|saved inputs|corpora", re.I),
     "third-party corpora not found, run make testdata"),
    (re.compile(r"cuda|gpu|nvjpeg|no device", re.I), "no GPU"),
]


def reason_of(text):
    text = " ".join((text or "").split())
    for pattern, said in REASONS:
        if pattern.search(text):
            return said
    return re.sub(r"^(skipped:\s*|Skipped:\s*)", "", text) or "no reason given"


def skipped_why(case):
    """A skipped case's reason: pytest's message, or the test's own "skipped: ..." line (ctest)."""
    skip = case.find("skipped")
    out = case.findtext("system-out") or ""
    said = [line for line in out.splitlines() if line.lower().startswith("skipped")]
    if said:
        return said[-1]
    return (skip.get("message") if skip is not None else "") or (skip.text if skip is not None else "")


def main(paths):
    passed = failed = 0
    skips = {}
    read = 0
    for path in paths:
        if not os.path.exists(path):
            continue
        read += 1
        root = ET.parse(path).getroot()
        for case in root.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None or case.get("status") == "fail":
                failed += 1
            elif case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
                why = reason_of(skipped_why(case))
                skips[why] = skips.get(why, 0) + 1
            else:
                passed += 1
    skipped = sum(skips.values())
    why = "; ".join(f"{n}: {r}" for r, n in sorted(skips.items(), key=lambda kv: -kv[1]))
    line = f"make test: {passed} passed, {failed} failed, {skipped} skipped" + (f" ({why})" if why else "")
    if read < len(paths):
        line += f"; {len(paths) - read} stage(s) did not report (see above)"
    print(line)
    return 1 if failed or read < len(paths) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
