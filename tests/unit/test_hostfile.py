"""dmlctl.spec.hostfile: DeepSpeed/MPI hostfiles, and choosing between them and YAML."""

from __future__ import annotations

from pathlib import Path

import pytest

from dmlctl.errors import SpecError, SpecIssue
from dmlctl.spec import ClusterSpec, HostSpec, load_cluster_file, load_hostfile
from dmlctl.spec.hostfile import is_hostfile


def write(tmp_path: Path, text: str, name: str = "hostfile") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def issues(path: str) -> list[tuple[int | None, str, str]]:
    with pytest.raises(SpecError) as info:
        load_hostfile(path)
    return [(i.line, i.path, i.message) for i in info.value.issues]


def slots_by_host(cluster: ClusterSpec) -> dict[str, int]:
    return {h.name: h.slots for h in cluster.resolved_hosts()}


# --------------------------------------------------------------------------- valid files


def test_deepspeed_hostfile(tmp_path: Path) -> None:
    cluster = load_hostfile(write(tmp_path, "worker-1 slots=4\nworker-2 slots=4\n"))
    assert slots_by_host(cluster) == {"worker-1": 4, "worker-2": 4}
    assert cluster.hosts[0] == HostSpec(name="worker-1", address="worker-1", slots=4)
    assert cluster.total_slots == 8
    first = cluster.resolved_hosts()[0]
    assert (first.port, first.user, first.identity_file, first.is_local) == (22, None, None, False)


def test_comments_blank_lines_defaults_and_mpi_tokens(tmp_path: Path) -> None:
    text = (
        "# our lab\n"
        "\n"
        "   \n"
        "gpu1 slots=2   # the big one\n"
        "\tgpu2\t max_slots=8 slots=3\n"
        "10.0.0.3\n"
        "fe80::1 max-slots=2\n"
        "localhost slots=1\n"
        "# trailing comment\n"
    )
    cluster = load_hostfile(write(tmp_path, text))
    assert slots_by_host(cluster) == {
        "gpu1": 2,
        "gpu2": 3,
        "10.0.0.3": 1,
        "fe80::1": 1,
        "localhost": 1,
    }
    assert [h.is_local for h in cluster.hosts] == [False, False, False, False, True]
    assert cluster.name == "default"


def test_windows_line_endings_and_bom(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_bytes(b"\xef\xbb\xbfa slots=2\r\nb\r\n")
    assert slots_by_host(load_hostfile(path)) == {"a": 2, "b": 1}


# --------------------------------------------------------------------------- errors


SLOTS = "expected an integer from 1 to 1024"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a slots=two\n", [(1, "slots", f"bad slots value 'two'; {SLOTS}")]),
        ("a slots=0\n", [(1, "slots", f"bad slots value '0'; {SLOTS}")]),
        ("a slots=-1\n", [(1, "slots", f"bad slots value '-1'; {SLOTS}")]),
        ("a slots=\n", [(1, "slots", f"bad slots value ''; {SLOTS}")]),
        ("a slots=1025\n", [(1, "slots", f"bad slots value '1025'; {SLOTS}")]),
        ("a slots=" + "9" * 19 + "\n", [(1, "slots", f"bad slots value '{'9' * 19}'; {SLOTS}")]),
        (
            "a max_slots=x\n",
            [(1, "max_slots", "bad max_slots value 'x'; expected an integer from 0 to 1024")],
        ),
        ("a slots=1 slots=2\n", [(1, "slots", "given twice on this line ('slots=2')")]),
        ("a slot=4\n", [(1, "", "unknown token 'slot=4'; did you mean 'slots='?")]),
        (
            "a cpus=4\n",
            [(1, "", "unknown token 'cpus=4'; expected slots=N (or MPI's max_slots=N)")],
        ),
        (
            "a b\n",
            [(1, "", "unknown token 'b'; expected 'hostname [slots=N]' (one host per line)")],
        ),
        ("a:4\n", [(1, "", "'a:4' is MPICH syntax; write 'a slots=4'")]),
        (
            "-oProxyCommand=x\n",
            [(1, "", "bad host name '-oProxyCommand=x': must not start with '-'")],
        ),
        ("a/b slots=1\n", [(1, "", "bad host name 'a/b': must not contain '/'")]),
        (
            "hosts:\n",
            [(1, "", "expected 'hostname [slots=N]', got 'hosts:'; is this a YAML file?")],
        ),
        ("a\nb\nA slots=2\n", [(3, "", "duplicate host 'A' (first at line 1)")]),
        ("", [(None, "", "no hosts; expected lines like 'gpu1 slots=4'")]),
        ("# nothing\n\n", [(None, "", "no hosts; expected lines like 'gpu1 slots=4'")]),
    ],
)
def test_issue(tmp_path: Path, text: str, expected: list[tuple[int | None, str, str]]) -> None:
    assert issues(write(tmp_path, text)) == expected


def test_every_issue_at_once_with_its_line(tmp_path: Path) -> None:
    text = (
        "# header\n"  # 1
        "gpu1 slots=4\n"  # 2
        "gpu2 slots=x\n"  # 3
        "\n"  # 4
        "gpu1 slots=2\n"  # 5
        "gpu3 slot=2 bogus\n"  # 6
    )
    path = write(tmp_path, text)
    assert [(line, where) for line, where, _ in issues(path)] == [
        (3, "slots"),
        (5, ""),
        (6, ""),
        (6, ""),
    ]
    with pytest.raises(SpecError) as info:
        load_hostfile(path)
    assert str(info.value.issues[0]) == (
        f"{path}:3 slots: bad slots value 'x'; expected an integer from 1 to 1024"
    )
    assert str(info.value.issues[1]) == f"{path}:5: duplicate host 'gpu1' (first at line 2)"
    assert info.value.exit_code == 2


def test_file_level_problems(tmp_path: Path) -> None:
    assert issues(str(tmp_path / "absent")) == [(None, "", "no such file")]
    assert issues(str(tmp_path)) == [(None, "", "is a directory; expected a hostfile")]
    (tmp_path / "bin").write_bytes(b"a\x00b\n")
    assert issues(str(tmp_path / "bin")) == [(None, "", "not a text file (contains NUL bytes)")]


# --------------------------------------------------------------------------- dispatch


@pytest.mark.parametrize(
    ("name", "text", "hostfile"),
    [
        ("hostfile", "hosts:\n  - address: a\n", True),  # the name decides
        ("lab.hostfile", "", True),
        ("hosts.txt", "a\n", True),
        ("cluster.yaml", "hosts:\n  - address: a\n", False),
        ("cluster.yaml", "# c\n\nname: lab\nhosts: []\n", False),
        ("cluster.yml", "{hosts: [{address: a}]}\n", False),
        ("cluster.yaml", "---\nhosts: []\n", False),
        ("cluster.yaml", "- a\n", False),
        ("cluster.yaml", "", False),
        ("cluster.yaml", "# only comments\n", False),
        ("hosts", "# lab\ngpu1 slots=4\n", True),  # the content decides
        ("hosts", "gpu1\n", True),
        ("hosts", "gpu1 slots=4 # c\n", True),
        ("hosts", "::1 slots=2\n", True),
        ("hosts", "gpu1:4\n", True),
        ("cluster.yaml", "gpu1 slots=4\n", True),
    ],
)
def test_is_hostfile(tmp_path: Path, name: str, text: str, hostfile: bool) -> None:
    assert is_hostfile(str(tmp_path / name), text) is hostfile


def test_load_cluster_file_reads_either(tmp_path: Path) -> None:
    from_hostfile = load_cluster_file(write(tmp_path, "# lab\ngpu1 slots=2\n", "lab"))
    assert slots_by_host(from_hostfile) == {"gpu1": 2}
    yaml = "name: lab\nhosts:\n  - address: gpu1\n    slots: 2\n"
    from_yaml = load_cluster_file(write(tmp_path, yaml, "cluster.yaml"))
    assert from_yaml.name == "lab"
    assert slots_by_host(from_yaml) == {"gpu1": 2}


def test_load_cluster_file_issues_keep_their_format(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_cluster_file(write(tmp_path, "hosts:\n  - address: a\n    slots: 0\n", "c.yaml"))
    assert info.value.issues == (
        SpecIssue(str(tmp_path / "c.yaml"), 3, "hosts[0].slots", "must be >= 1, got 0"),
    )
    with pytest.raises(SpecError) as info:
        load_cluster_file(write(tmp_path, "a slots=0\n", "hosts.txt"))
    assert [(i.line, i.path) for i in info.value.issues] == [(1, "slots")]
    with pytest.raises(SpecError) as info:
        load_cluster_file(tmp_path)
    assert (
        info.value.issues[0].message == "is a directory; expected a cluster file (YAML or hostfile)"
    )
