"""The ``command:`` section of a case file and its preflight rules (harness.spec.command)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.arms import plan_case
from harness.errors import CaseError
from harness.spec.comparisons import command_problems
from harness.spec.deprecations import CaseFileDeprecation
from harness.spec.loader import load_cases

BASE = """\
name: cmd
resources: {gpus_per_node: 2}
train: {steps: 4, global_batch: 8, seq_length: 16, lr: 1.0e-3}
command:
  argv: [python, train.py, --train-iters, "{steps}"]
  arms: {graph: [--cuda-graph-impl, local]}
  metrics: {source: tensorboard}
compare:
  graph_vs_eager: {loss: exact}
"""


def _load(tmp_path: Path, text: str):
    path = tmp_path / "case.yaml"
    path.write_text(text)
    return load_cases([path])


def test_a_command_case_plans_the_same_arms_and_marks_what_it_lacks(tmp_path: Path) -> None:
    (case,) = _load(tmp_path, BASE)
    plan = plan_case(case)
    assert plan.arm_names == ("graph", "eager")
    (pair,) = plan.pairs
    why = pair.not_applicable_checks
    assert set(why) == {"aux_loss", "capture", "variants_replayed", "graph_pool_bytes",
                        "device_delta_pct", "graph.packing", "eager.packing"}
    assert "command.metrics.tags" in why["aux_loss"]
    assert "carry no memory probe" in why["device_delta_pct"]
    assert "source tensorboard" in why["device_delta_pct"]
    assert "command" not in load_cases(["cases/focused"])[0].model_dump(mode="json")


def test_only_the_contract_with_capture_checks_marks_them(tmp_path: Path) -> None:
    """``Judged.capture_checks``: graph_vs_eager's pair marks them, a repeat pair has none."""
    text = BASE.replace("compare:\n", "compare:\n  repeat: {loss: {max_rel: 1.0e-6}}\n")
    pairs = {p.contract: p.not_applicable_checks for p in plan_case(_load(tmp_path, text)[0]).pairs}
    assert {"capture", "variants_replayed"} <= set(pairs["graph_vs_eager"])
    assert set(pairs["repeat"]) == {"aux_loss", "eager.packing", "eager-repeat.packing"}


@pytest.mark.parametrize("edit, field, message", [
    (("  arms: {graph: [--cuda-graph-impl, local]}\n", ""), "command.arms.graph",
     "compare.graph_vs_eager needs the arguments of this arm role"),
    (('  argv: [python, train.py, --train-iters, "{steps}"]\n', "  argv: python train.py\n"),
     "command.argv", "never a shell string"),
    (('"{steps}"', '"{step}"'), "command.argv.3", "unknown placeholder {step}"),
    (("  metrics: {source: tensorboard}\n", ""), "command.metrics", "required field is missing"),
    (("source: tensorboard", "source: wandb"), "command.metrics.source", "tensorboard"),
    (("  arms: {", "  env: {K: v}\n  secret_env: [K]\n  arms: {"), "command.secret_env",
     "also in command.env"),
    (("compare:\n", "graphs: {}\ncompare:\n"), "graphs", "not a command case's"),
    (("compare:\n", "compare:\n  slot_ring: {microbatches: [2, 4]}\n"), "compare.slot_ring",
     "not a command case's (it runs the built-in graph pool per microbatch count): drop it"),
    (("compare:\n", "compare:\n  resume: {}\n"), "command.resume",
     "compare.resume stops an arm and resumes it: say how the command saves and loads"),
    (("  metrics:", "  resume: {save: [--save], load: [--load]}\n  metrics:"), "command.resume",
     "no arm is resumed without compare.resume"),
    (("  metrics:", "  resume: {save: [--exit, '{stop}'], load: [--load]}\n  metrics:"),
     "command.resume", "compare.resume"),
    (('"{steps}"]', '"{steps}", --exit-interval, "{stop}"]'), "command.argv.5",
     "{stop} is the step a -resumed arm stops after"),
    (("tensorboard}\ncompare:\n", "tensorboard}\n  resume: {save: [--s], load: [--l]}\n"
      "compare:\n  resume: {at_step: 4}\n"), "compare.resume.at_step",
     "must resume before the last of the 4 train.steps"),
    (("compare:\n", "compare:\n  reference: {}\n"), "command.arms.reference",
     "compare.reference needs the arguments of this arm role (the single-rank reference arm"),
    (('"{steps}"]', '"{steps}", --master-port, "{master_port}"]'), "command.argv.5",
     "{master_port} is a launcher's rendezvous (command.ranks: launcher)"),
])
def test_a_bad_command_section_names_file_case_and_field(tmp_path: Path, edit: tuple[str, str],
                                                         field: str, message: str) -> None:
    assert edit[0] in BASE
    with pytest.raises(CaseError) as err:
        _load(tmp_path, BASE.replace(*edit))
    assert err.value.field == field and message in str(err.value)
    assert "case.yaml" in str(err.value) and "'cmd'" in str(err.value)


def test_each_role_a_comparison_needs_is_asked_for_once(tmp_path: Path) -> None:
    """Two comparisons need the graph role: one problem names the first; each names its own."""
    text = BASE.replace("local]}", "local], graph-separate-pools: [--x]}").replace(
        "compare:\n", "compare:\n  graph_pools: {}\n")
    (case,) = _load(tmp_path, text)
    assert command_problems(case) == []
    bare = case.model_copy(update={"command": case.command.model_copy(update={"arms": {}})})
    assert [(p.field, p.message.split(" (")[0]) for p in command_problems(bare)] == [
        ("command.arms.graph", "compare.graph_vs_eager needs the arguments of this arm role"),
        ("command.arms.graph-separate-pools", "compare.graph_pools needs the arguments of this "
                                              "arm role")]


def test_a_launchers_arguments_may_name_its_rendezvous(tmp_path: Path) -> None:
    text = BASE.replace('"{steps}"]', '"{steps}", --master-port, "{master_port}", --node-rank, '
                        '"{node_rank}", --master-addr, "{master_addr}"]\n  ranks: launcher')
    (case,) = _load(tmp_path, text)
    assert case.command.ranks.value == "launcher"


def test_a_fixed_cp_role_beside_a_graph_role_is_named_not_ignored(tmp_path: Path) -> None:
    """With command.arms.graph, dcp_vs_fixed_cp compares graph against graph-fixed-cp<N>: a
    fixed-cp role's arguments go unused, as in earlier releases, and a deprecation warning
    says which role to give them to (spec.deprecations)."""
    for edit, role, says in (
            (("local]}", "local], fixed-cp: [--cp, '{fixed_cp}']}"), "fixed-cp",
             "no arm of this case runs the 'fixed-cp' role, so its arguments are not used "
             "(no comparison the case sets runs that role)"),
            (("local]}", "local], repeat: [--x]}"), "repeat",
             "no arm of this case runs the 'repeat' role")):
        (case,) = _load(tmp_path, BASE.replace(*edit))
        with pytest.warns(CaseFileDeprecation) as got:
            plan = plan_case(case)
        (warning,) = got
        assert f"field 'command.arms.{role}': deprecated since" in str(warning.message)
        assert says in str(warning.message)
        assert str(warning.message).endswith("fix: drop it, or add the comparison that runs it")
        assert plan.arm_names == ("graph", "eager")
    text = (BASE.replace("resources: {gpus_per_node: 2}",
                         "resources: {gpus_per_node: 2}\nparallel: {dynamic_cp: [1, 2]}")
            .replace("lr: 1.0e-3}", "lr: 1.0e-3, max_seqlen_per_rank: 16}")
            .replace("local]}", "local], graph-fixed-cp: [--cp, '{fixed_cp}'], fixed-cp: [--f]}")
            .replace("compare:\n", "compare:\n  dcp_vs_fixed_cp: {fixed_cp: 2}\n"))
    (case,) = _load(tmp_path, text)
    with pytest.warns(CaseFileDeprecation) as got:
        plan_case(case)
    (warning,) = got
    assert "field 'command.arms.fixed-cp'" in str(warning.message)
    assert "compares the graph arms (graph against graph-fixed-cp<N>)" in str(warning.message)
    assert "fix: drop it (command.arms.graph-fixed-cp gives that arm's arguments)" in str(
        warning.message)
    (case,) = _load(tmp_path, text.replace(", fixed-cp: [--f]", ""))
    assert "graph-fixed-cp2" in plan_case(case).arm_names
