"""Progress when stderr is not a terminal (nohup, SLURM, CI): a line every ``every_s`` seconds, none by default in
tests, none at all for a job shorter than one interval."""

from __future__ import annotations

import re
import time

from cupid_exp.llm.usage import Completion, UsageMeter
from cupid_exp.progress import Progress

LINE = re.compile(r"^progress: (\d+)/(\d+) instances \(\d+%\); calls (\d+) \((\d+) cached, (\d+) failed\); "
                  r"\$(\d+\.\d{4}); \d+\.\d instances/min; \d+m\d\ds elapsed(, ~\d+m\d\ds left)?$")


def test_a_job_without_a_terminal_prints_a_progress_line_every_interval(capsys) -> None:
    meter = UsageMeter()
    progress = Progress(["infer", "inference"], 4, meter, every_s=0.1)
    assert not progress.bars and progress.lines is not None  # capsys' stderr is no terminal: lines, not bars
    meter.add("infer", Completion("x", 10, 5, cost_usd=0.25))
    meter.fail("match_recall", "provider")
    progress.done("infer")
    progress.done("inference")  # one instance through both stages
    time.sleep(0.35)
    progress.instance_done()
    progress.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3 and all(LINE.match(line) for line in lines), lines
    first, last = LINE.match(lines[0]).groups(), LINE.match(lines[-1]).groups()
    assert first[:5] == ("1", "4", "1", "0", "1") and first[5] == "0.2500" and first[6]  # done, total, calls, left
    assert last[:2] == ("2", "4")  # the closing line says where it ended


def test_no_lines_when_off_or_shorter_than_one_interval(capsys) -> None:
    for every_s, enabled in ((0.0, True), (0.1, False), (30.0, True)):
        progress = Progress(["infer"], 2, UsageMeter(), enabled=enabled, every_s=every_s)
        progress.instance_done()
        time.sleep(0.15)
        progress.close()
    assert capsys.readouterr().err == ""
