#!/usr/bin/env python3
"""Print where the test run's time went, from nextest's JUnit report
(target/nextest/ci/junit.xml, written by `cargo nextest run --profile ci`):
one line per test binary, and per module of the integration-test binary
`it`, with the number of tests, their summed time and the slowest test.
Tests run side by side, so the sums add up to more than the wall time."""
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

path = sys.argv[1] if len(sys.argv) > 1 else "target/nextest/ci/junit.xml"
try:
    root = ET.parse(path).getroot()
except (OSError, ET.ParseError) as e:
    print(f"test-times: cannot read {path}: {e}")
    sys.exit(0)

rows = defaultdict(lambda: [0, 0.0, 0.0, ""])
for suite in root.iter("testsuite"):
    binary = suite.get("name", "?")
    for case in suite.iter("testcase"):
        name = case.get("name", "?")
        t = float(case.get("time", "0") or 0)
        group = binary
        if binary.endswith("::it") and "::" in name:
            group = f"{binary} {name.split('::', 1)[0]}"
        row = rows[group]
        row[0] += 1
        row[1] += t
        if t >= row[2]:
            row[2], row[3] = t, name

print("tests by binary and module (summed test time; slowest test):")
for group, (n, total, worst, worst_name) in sorted(rows.items(), key=lambda r: -r[1][1]):
    print(f"  {group:<40} {n:>4} tests {total:>8.1f} s   {worst:>6.1f} s {worst_name}")
