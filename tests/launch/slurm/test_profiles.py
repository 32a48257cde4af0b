"""Cluster profiles: the shipped ones load, and every error names the file and the field."""

from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.launch.slurm.profiles import (
    DETERMINISM_ENV,
    REPO_PROFILES,
    find_profile,
    load_profile,
    parse_profile,
)

MINIMAL = "name: mini\ngpus_per_node: 4\n"


def test_shipped_profiles_load():
    local = load_profile("local")
    assert (local.name, local.gpus, local.partition) == ("local", False, "debug")
    gb200 = load_profile("gb200")
    assert gb200.gpus and gb200.gpus_per_node == 4
    assert sorted(p.stem for p in REPO_PROFILES.glob("*.yaml")) >= ["gb200", "local"]


def test_environment_layers_determinism_nccl_env():
    p = parse_profile(MINIMAL + "nccl: {NCCL_DEBUG: INFO}\nenv: {CUBLAS_WORKSPACE_CONFIG: ':16:8'}\n",
                      "mini.yaml")
    env = p.environment()
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # env wins over the determinism default
    assert env["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == DETERMINISM_ENV["NVTE_ALLOW_NONDETERMINISTIC_ALGO"]
    off = parse_profile(MINIMAL + "determinism: false\n", "mini.yaml")
    assert off.environment() == {}


def test_setup_lines_quote_values_and_container_args():
    p = parse_profile(MINIMAL + "setup: [module load cuda]\nenv: {MSG: 'a b'}\n"
                      "container: {image: 'nvcr.io#x', mounts: ['/a:/a', '/b:/b']}\n", "m.yaml")
    assert p.setup_lines()[0] == "module load cuda"
    assert "export MSG='a b'" in p.setup_lines()
    assert p.all_srun_args() == ["--container-image=nvcr.io#x", "--container-mounts=/a:/a,/b:/b"]


@pytest.mark.parametrize("text, field, words", [
    ("partion: batch\n", "partion", "unknown field"),
    ("gpus_per_node: 0\n", "gpus_per_node", "greater than or equal to 1"),
    ("env: {RANK: '3'}\n", "env", "set by the launcher"),
    ("nccl: {OMP_NUM_THREADS: '1'}\n", "nccl", "not an NCCL variable"),
    ("sbatch: {time: 10}\n", "sbatch", "set by the harness"),
    ("container: {image: x, mount: []}\n", "container.mount", "unknown field"),
    ("max_time_min: 1\nsignal_delay_s: 90\n", "(top level)", "signal_delay_s"),
])
def test_errors_name_file_and_field(text, field, words):
    body = MINIMAL.replace("gpus_per_node: 4\n", "") if "gpus_per_node" in text else MINIMAL
    with pytest.raises(ConfigError) as err:
        parse_profile(body + text, "slurm/profiles/mini.yaml")
    msg = str(err.value)
    assert msg.startswith(f"slurm/profiles/mini.yaml: field '{field}'"), msg
    assert words in msg


def test_missing_required_field_and_not_a_mapping():
    with pytest.raises(ConfigError, match="field 'gpus_per_node': Field required"):
        parse_profile("name: x\n", "x.yaml")
    with pytest.raises(ConfigError, match="one YAML mapping"):
        parse_profile("- a\n", "x.yaml")


def test_name_defaults_to_file_stem(tmp_path):
    path = tmp_path / "mycluster.yaml"
    path.write_text("gpus_per_node: 8\n")
    assert load_profile(str(path)).name == "mycluster"


def test_unknown_profile_lists_known_names(tmp_path):
    (tmp_path / "alpha.yaml").write_text("gpus_per_node: 1\n")
    with pytest.raises(ConfigError, match="known profiles: alpha"):
        find_profile("beta", [tmp_path])
    assert find_profile("alpha", [tmp_path]) == tmp_path / "alpha.yaml"
    with pytest.raises(ConfigError, match="does not exist"):
        find_profile(str(tmp_path / "nope.yaml"))


def test_profiles_env_folder_searched_first(tmp_path, monkeypatch):
    (tmp_path / "local.yaml").write_text("gpus_per_node: 2\npartition: mine\n")
    monkeypatch.setenv("DCP_HARNESS_PROFILES", str(tmp_path))
    assert load_profile("local").partition == "mine"
    assert Path(find_profile("gb200")).parent == REPO_PROFILES
