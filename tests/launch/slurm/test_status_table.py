"""`dcp-harness status`: a case skipped at submit time shows none of its arms as done."""

from pathlib import Path

from rich.console import Console

from harness.cli.submit_cmd import status_renderable
from harness.launch.slurm.status import skipped_status


def test_a_case_skipped_at_submit_is_not_shown_with_its_arms_done() -> None:
    status = skipped_status("gpu1-qwen3-graphs.scope-attn", "needs CUDA; profile 'local' "
                            "requests no GPUs", arms_total=4)
    assert (status.arms_done, status.arms_total, status.state) == (0, 4, "skipped")
    console = Console(width=200, record=True)
    console.print(status_renderable([status], Path("sweep")))
    row = next(line for line in console.export_text().splitlines() if "gpu1-qwen3" in line)
    assert "0/4" in row and "4/4" not in row
