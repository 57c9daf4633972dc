"""csrun.yaml: where it is found, what it holds, and the errors that name key and file."""
from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import CSRunError
from launcher.site_config import SiteConfig, SlurmConfig, load_site_config

EXAMPLE = Path(__file__).resolve().parents[2] / "slurm" / "csrun.example.yaml"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_no_file_gives_the_defaults(tmp_path):
    config = load_site_config({"HOME": str(tmp_path / "home")}, tmp_path)
    if Path("/etc/csrun/csrun.yaml").exists():
        pytest.skip("this machine has /etc/csrun/csrun.yaml")
    assert config == SiteConfig()
    assert config.path is None and config.container.image is None and config.mount_dirs == ()
    assert (config.slurm.nodes, config.slurm.tasks_per_node, config.slurm.cpus_per_task) == (1, 1, 1)
    assert config.slurm.gres == "cs:1" and config.slurm.partition is None


def test_search_order_env_then_cwd_then_home(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "work"
    write(home / ".config/csrun/csrun.yaml", "slurm: {partition: home}\n")
    assert load_site_config({"HOME": str(home)}, cwd).slurm.partition == "home"
    write(cwd / "csrun.yaml", "slurm: {partition: cwd}\n")
    assert load_site_config({"HOME": str(home)}, cwd).slurm.partition == "cwd"
    explicit = write(tmp_path / "site.yaml", "slurm: {partition: env}\n")
    config = load_site_config({"HOME": str(home), "CSRUN_CONFIG": str(explicit)}, cwd)
    assert (config.slurm.partition, config.path) == ("env", explicit)


def test_the_shipped_example_loads(tmp_path):
    config = load_site_config({"CSRUN_CONFIG": str(EXAMPLE)}, tmp_path)
    assert config.path == EXAMPLE
    assert config.container.image == "/opt/csrun/csrun.sif" and config.container.runtime == "apptainer"
    assert config.mount_dirs == ("/data", "/scratch")
    assert config.slurm == SlurmConfig()


def test_values_and_relative_image(tmp_path):
    path = write(tmp_path / "etc/csrun.yaml", """
container: {image: images/csrun.sif}
mount_dirs: /data, /scratch:/mnt/scratch
slurm: {nodes: 4, tasks_per_node: 8, cpus_per_task: 2, partition: cpu, gres: null,
        gres_node: cs-node, time: 90}
""")
    config = load_site_config({"CSRUN_CONFIG": str(path)}, tmp_path)
    assert config.container.image == str(tmp_path / "etc/images/csrun.sif")
    assert config.container.runtime is None
    assert config.mount_dirs == ("/data", "/scratch:/mnt/scratch")
    assert config.slurm == SlurmConfig(4, 8, 2, "cpu", None, "cs-node", "90")


def test_empty_file_gives_the_defaults(tmp_path):
    path = write(tmp_path / "csrun.yaml", "# nothing set yet\n")
    assert load_site_config({"HOME": str(tmp_path)}, tmp_path) == SiteConfig(path=path)


@pytest.mark.parametrize("text, message", [
    ("slurm: {nodse: 2}\n", "unknown key 'slurm.nodse'"),
    ("images: x.sif\n", "unknown key 'images'"),
    ("slurm: {nodes: two}\n", "slurm.nodes must be a whole number of at least 1, not str 'two'"),
    ("slurm: {nodes: 0}\n", "slurm.nodes must be a whole number of at least 1"),
    ("slurm: {cpus_per_task: true}\n", "slurm.cpus_per_task must be a whole number"),
    ("slurm: {tasks_per_node: null}\n", "slurm.tasks_per_node must be a whole number of at least 1, not nothing"),
    ("slurm: [1, 2]\n", "slurm must be a mapping, not list"),
    ("- a\n- b\n", "the top level must be a mapping"),
    ("mount_dirs: {a: 1}\n", "mount_dirs must be a list of paths"),
    ("container: {runtime: docker}\n", "container.runtime is 'docker'"),
    ("container: {image: [a]}\n", "container.image must be a string, not list"),
    ("slurm: {time: 'two hours'}\n", "slurm.time 'two hours' is not a Slurm time"),
    ("slurm: {partition: ''}\n", "slurm.partition is empty"),
    ("slurm: {requeue: 'yes'}\n", "slurm.requeue must be true or false, not str 'yes'"),
    ("slurm: {nodes: 1\n", "is not valid YAML at line 2"),
])
def test_bad_files_name_the_key_and_the_file(tmp_path, text, message):
    path = write(tmp_path / "csrun.yaml", text)
    with pytest.raises(CSRunError) as error:
        load_site_config({"HOME": str(tmp_path)}, tmp_path)
    assert str(path) in error.value.message and message in error.value.message
    assert error.value.hint


def test_unknown_key_hint_lists_the_known_ones(tmp_path):
    write(tmp_path / "csrun.yaml", "slurm: {gpus: 1}\n")
    with pytest.raises(CSRunError) as error:
        load_site_config({"HOME": str(tmp_path)}, tmp_path)
    assert "nodes, tasks_per_node, cpus_per_task, partition, gres, gres_node, time" in error.value.hint


def test_csrun_config_naming_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(CSRunError, match="CSRUN_CONFIG names .*nope.yaml, which is not a file"):
        load_site_config({"CSRUN_CONFIG": "nope.yaml"}, tmp_path)
