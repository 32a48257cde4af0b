"""Bad input to ``dcp-harness bisect``: each a clear error (exit 2) before anything runs, and
nothing lost (the user's checkout and any folder given stay as they were)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.bisect import Request, plan
from harness.bisect.state import STATE_FILE
from harness.cli import main
from harness.errors import ConfigError
from tests.bisect.toyrepo import git, make_repo, write_case


@pytest.fixture
def toy(tmp_path: Path) -> tuple[Path, list[str], Path]:
    repo = tmp_path / "toy"
    shas = make_repo(repo, 5, bad_at=3)
    return repo, shas, write_case(tmp_path / "cases", repo)


def refused(capsys, *argv: str) -> str:
    assert main(["bisect", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before any step ran
    return captured.err


def test_unknown_revisions_are_named(toy, capsys, tmp_path: Path) -> None:
    repo, shas, case = toy
    err = refused(capsys, str(case), "--good", "v0.0-nope", "--bad", "main",
                  "--out", str(tmp_path / "o"))
    assert f"--good v0.0-nope: no such commit in {repo}" in err
    err = refused(capsys, str(case), "--good", shas[0], "--bad", "deadbeef",
                  "--out", str(tmp_path / "o"))
    assert f"--bad deadbeef: no such commit in {repo}" in err
    assert not (tmp_path / "o").exists()


def test_good_after_bad_and_the_same_commit_are_refused(toy, capsys, tmp_path: Path) -> None:
    repo, shas, case = toy
    err = refused(capsys, str(case), "--good", shas[4], "--bad", shas[1],
                  "--out", str(tmp_path / "o"))
    assert f"--good {shas[4]} ({shas[4][:12]}) is not an ancestor of --bad {shas[1]}" in err
    err = refused(capsys, str(case), "--good", "main", "--bad", shas[-1],
                  "--out", str(tmp_path / "o"))
    assert "are the same commit" in err
    assert not (tmp_path / "o").exists()


def test_a_good_commit_on_a_side_branch_is_not_an_ancestor(toy, capsys, tmp_path: Path) -> None:
    repo, shas, case = toy
    git(repo, "checkout", "-q", "-b", "side", shas[1])
    (repo / "side.txt").write_text("x\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "side")
    side = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    err = refused(capsys, str(case), "--good", side, "--bad", "main",
                  "--out", str(tmp_path / "o"))
    assert "is not an ancestor of --bad main" in err


def test_local_changes_refused_when_an_end_is_head_and_nothing_is_lost(toy, capsys,
                                                                       tmp_path: Path) -> None:
    repo, shas, case = toy
    (repo / "train.py").write_text((repo / "train.py").read_text() + "# my edit\n")
    err = refused(capsys, str(case), "--good", shas[0], "--bad", "HEAD",
                  "--out", str(tmp_path / "o"))
    assert f"{repo} has local changes (train.py) and an end of the range is its HEAD" in err
    assert "commit or stash them" in err and "--allow-dirty" in err
    assert (repo / "train.py").read_text().endswith("# my edit\n")  # nothing lost
    # with an older bad end the changes do not matter: the plan goes ahead
    target, key, commits = plan(Request(good=shas[0], bad=shas[4], paths=(str(case),)))
    assert key.bad == shas[4] and len(commits) == 4
    target, key, commits = plan(Request(good=shas[0], bad="HEAD", paths=(str(case),),
                                        allow_dirty=True))
    assert key.bad == shas[5]


def test_a_command_outside_any_repository_is_refused(tmp_path: Path, capsys) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    case = write_case(tmp_path / "cases", plain)
    err = refused(capsys, str(case), "--good", "a", "--bad", "b",
                  "--out", str(tmp_path / "o"))
    assert f"field 'command.cwd': {plain} is not in a git repository" in err


def test_a_command_outside_the_given_repo_is_refused(toy, capsys, tmp_path: Path) -> None:
    repo, shas, case = toy
    other = tmp_path / "other"
    make_repo(other, 1, bad_at=5)
    err = refused(capsys, str(case), "--good", "a", "--bad", "b", "--repo", str(other))
    assert f"the command runs in {repo}, outside --repo {other}" in err


def test_a_folder_that_is_not_a_bisect_is_refused_and_left_alone(toy, capsys,
                                                                  tmp_path: Path) -> None:
    repo, shas, case = toy
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "summary.md").write_text("mine\n")
    err = refused(capsys, str(case), "--good", shas[0], "--bad", "main", "--out", str(out))
    assert f"--out {out.resolve()} holds files but no {STATE_FILE}" in err
    assert [p.name for p in out.iterdir()] == ["summary.md"]


def test_a_damaged_state_file_is_named_and_kept(toy, capsys, tmp_path: Path) -> None:
    repo, shas, case = toy
    out = tmp_path / "b"
    out.mkdir()
    (out / STATE_FILE).write_text('{"version": 1, "key": {"repo": 3}}\n')
    err = refused(capsys, str(case), "--good", shas[0], "--bad", "main", "--out", str(out))
    assert f"{out.resolve() / STATE_FILE}: not a bisect state" in err and "field 'key" in err
    (out / STATE_FILE).write_text('{"version": 1, "ke')
    err = refused(capsys, str(case), "--good", shas[0], "--bad", "main", "--out", str(out))
    assert "not valid JSON" in err and "pass a fresh --out" in err
    assert (out / STATE_FILE).read_text() == '{"version": 1, "ke'


def test_built_in_case_files_with_local_changes_are_refused(tmp_path: Path) -> None:
    repo = tmp_path / "h"
    make_repo(repo, 1, bad_at=5)
    case = repo / "cases" / "c.yaml"
    case.parent.mkdir()
    case.write_text("name: c\ntrain: {steps: 2, global_batch: 4, seq_length: 16, lr: 1.0e-3}\n"
                    "data: {lengths: {min: 4, max: 16}}\nresources: {gpus_per_node: 1}\n")
    with pytest.raises(ConfigError, match="has local changes or is not committed: each step reads"):
        plan(Request(good="main~1", bad="main", paths=(str(case),), repo=repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "case")
    target, key, commits = plan(Request(good="main~2", bad="main", paths=(str(case),), repo=repo))
    assert key.mode.value == "builtin" and target.repo == repo.resolve() and len(commits) == 2


def test_cases_of_both_kinds_are_refused(toy, tmp_path: Path) -> None:
    repo, shas, case = toy
    (case.parent / "b.yaml").write_text(
        "name: b\ntrain: {steps: 2, global_batch: 4, seq_length: 16, lr: 1.0e-3}\n"
        "data: {lengths: {min: 4, max: 16}}\nresources: {gpus_per_node: 1}\n")
    with pytest.raises(ConfigError,
                       match="bisect one kind of case at a time: toy run a command and b"):
        plan(Request(good=shas[0], bad="main", paths=(str(case.parent),)))
