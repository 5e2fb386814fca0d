"""The "bounds" section of `boundjax demo` (IBP vs CROWN certified-robust accuracy)."""

import re

from boundjax.transforms import demo_section


def test_bounds_demo_reports_sound_certified_accuracy():
  text = demo_section(eps_list=(0.01, 0.05), steps=120, n_samples=40)
  rows = [l.split() for l in text.splitlines() if re.match(r"\s+0\.0\d\d\s", l)]
  assert len(rows) == 2, text
  for eps, ibp_acc, ibp_t, crown_acc, crown_t in rows:
    assert 0.0 <= float(ibp_acc) <= float(crown_acc) <= 1.0, text  # CROWN never looser than IBP
    assert ibp_t.endswith("ms") and crown_t.endswith("ms")
  # certified-robust accuracy cannot grow with eps
  assert float(rows[1][1]) <= float(rows[0][1]) and float(rows[1][3]) <= float(rows[0][3])
  m = re.search(r"violations, must be 0\): (\d+) of (\d+)", text)
  assert m and int(m.group(1)) == 0 and int(m.group(2)) == 40 * 2 * 2 * 2 * 114, text

