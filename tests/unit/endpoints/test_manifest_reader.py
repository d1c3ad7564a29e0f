"""Reading manifest files: which files, bytes to text, the YAML builder, chunks, syntax."""

from __future__ import annotations

import pytest

from kubeport.endpoints.manifests.documents import check_syntax
from kubeport.endpoints.manifests.parse import CHUNK_OBJECTS, iter_manifest, parse_manifest
from kubeport.endpoints.manifests.read import (
    STREAM_ABOVE_BYTES,
    decode,
    is_manifest_path,
    list_manifest_files,
    read_manifest,
)

SERVICE = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec: {ports: [{port: 80}]}\n"


@pytest.mark.parametrize(
    "relative, expected",
    [
        pytest.param("web.yaml", True, id="yaml"),
        pytest.param("sub/dir/web.yml", True, id="yml_nested"),
        pytest.param("web.json", True, id="json"),
        pytest.param("web.yaml~", False, id="editor_backup"),
        pytest.param(".web.yaml.swp", False, id="vim_swap"),
        pytest.param(".#web.yaml", False, id="emacs_lock"),
        pytest.param("..data/web.yaml", False, id="configmap_hidden_twin"),
        pytest.param(".git/x.yaml", False, id="hidden_directory"),
        pytest.param("web.YAML", False, id="extension_case_sensitive__kubectl"),
        pytest.param("notes.txt", False, id="other_extension"),
    ],
)
def test_is_manifest_path(relative, expected):
    assert is_manifest_path(relative) is expected


def test_list_manifest_files_recursive_skipping_hidden(tmp_path):
    for name in ["b.yaml", "a/c.yml", "a/d.json", "a/notes.txt", ".hidden/x.yaml", "a/.e.yaml", "a/b/deep.yaml"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert sorted(list_manifest_files(tmp_path)) == ["a/b/deep.yaml", "a/c.yml", "a/d.json", "b.yaml"]


def test_list_manifest_files_follows_file_links_not_directory_links(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "svc.yaml").write_text("kind: Service")
    (tmp_path / "dir.yaml").mkdir()  # a directory is walked, whatever its name
    (tmp_path / "dir.yaml" / "in.yaml").write_text("")
    (tmp_path / "linked.yaml").symlink_to("real/svc.yaml")
    (tmp_path / "linked-dir").symlink_to("real")  # not walked: a link can make a loop
    (tmp_path / "loop.yaml").symlink_to(".")
    (tmp_path / "dangling.yaml").symlink_to("gone.yaml")
    listed = list_manifest_files(tmp_path)
    assert sorted(listed) == ["dir.yaml/in.yaml", "linked.yaml", "real/svc.yaml"]
    # The target's key: re-pointing the link at another file is a change.
    assert listed["linked.yaml"] == listed["real/svc.yaml"]


@pytest.mark.parametrize(
    "data, text, problem",
    [
        pytest.param(b"\xef\xbb\xbfkind: Service", "kind: Service", None, id="utf8_bom_dropped"),
        pytest.param(b"kind: \xff", None, "a.yaml: not UTF-8 text (byte 6: invalid start byte)", id="not_utf8"),
    ],
)
def test_decode(data, text, problem):
    assert decode("a.yaml", data) == (text, problem)


# --- the YAML builder: PyYAML SafeLoader's values, faster ------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("a: yes\nb: on\nc: No\nd: true", id="yaml11_booleans"),
        pytest.param("a: 010\nb: 0x1F\nc: 1_000\nd: 0b101\ne: 190:20:30\nf: -3\ng: +3\nh: 0", id="yaml11_integers"),
        pytest.param("a: 1.5\nb: .inf\nc: 1e3\nd: 6.8523015e+5", id="floats"),
        pytest.param("a: ~\nb: null\nc:\nd: ''", id="nulls_and_empty"),
        pytest.param("a: '010'\nb: \"yes\"\nc: !!str 12", id="quoted_and_tagged_strings"),
        pytest.param("b: &x {c: 1}\nd: *x", id="anchor_alias"),
        pytest.param("base: &b {x: 1, y: 2}\nm:\n  <<: *b\n  y: 3", id="merge_key_explicit_wins"),
        pytest.param("a: !!binary aGVsbG8=\nb: !!set {x, y}", id="other_standard_tags"),
    ],
)
def test_yaml_values_match_safe_loader(text):
    import yaml

    from kubeport.endpoints.manifests import yaml_nodes

    built = [yaml_nodes.build(node) for node in yaml_nodes.compose_documents(text)]
    assert built == list(yaml.load_all(text, Loader=yaml.SafeLoader))


def test_yaml_timestamps_stay_text__apiserver_reads_json():
    parsed = parse_manifest("a.yaml", "kind: Service\nmetadata: {name: web, creationTimestamp: 2024-05-01T10:00:00Z}\n")
    assert parsed.objects[0].obj.metadata.creation_timestamp.year == 2024  # pydantic parses the text


@pytest.mark.parametrize(
    "text, problem",
    [
        pytest.param("kind: Service\nmetadata: {name: !foo web}\n",
                     "a.yaml: YAML syntax error at line 2, column 18: could not determine a constructor for the tag '!foo'",
                     id="unknown_tag"),
        pytest.param("kind: Service\nmetadata: {name: web}\n? [1]\n: 2\n", "a.yaml: YAML syntax error at line 3, column 3: "
                     "found an unhashable key (while building a mapping)", id="unhashable_key"),
        pytest.param("kind: Service\nmetadata: {name: *nope}\n", "a.yaml: YAML syntax error at line 2, column 18: "
                     "found undefined alias", id="undefined_alias"),
    ],
)
def test_yaml_build_errors_fail_the_file(text, problem):
    parsed = parse_manifest("a.yaml", text)
    assert parsed.failed and parsed.problems == (problem,)


# --- chunks, syntax check, reading ---------------------------------------------------------------


def many_services(count: int) -> str:
    return "".join(f"---\nkind: Service\nmetadata: {{name: s{i}}}\nspec: {{ports: [{{port: 80}}]}}\n" for i in range(count))


def test_iter_manifest_streams_in_chunks():
    chunks = list(iter_manifest("a.yaml", many_services(7), chunk_objects=3))
    assert [len(c.objects) for c in chunks] == [3, 3, 1]
    assert [o.key[2] for c in chunks for o in c.objects] == [f"s{i}" for i in range(7)]


def test_iter_manifest_syntax_error_after_a_chunk_ends_with_a_failed_chunk():
    chunks = list(iter_manifest("a.yaml", many_services(4) + "---\nkind: [\n", chunk_objects=3))
    assert [c.failed for c in chunks] == [False, True]
    assert parse_manifest("a.yaml", many_services(4) + "---\nkind: [\n").failed


@pytest.mark.parametrize(
    "path, text, problem",
    [
        pytest.param("a.yaml", many_services(2), None, id="yaml_ok"),
        pytest.param("a.yaml", many_services(2) + "---\nkind: [\n", "a.yaml: YAML syntax error at line 11, column 1: "
                     "did not find expected node content (while parsing a flow node)", id="yaml_broken"),
        pytest.param("a.json", '{"kind": "Node"}\n{"kind": ', "a.json: JSON syntax error at line 2, column 10: "
                     "Expecting value", id="json_broken"),
    ],
)
def test_check_syntax(path, text, problem):
    assert check_syntax(path, text) == problem


def test_read_manifest(tmp_path):
    (tmp_path / "a.yaml").write_text(SERVICE)
    first = read_manifest(tmp_path, "a.yaml")
    assert [o.key for o in first.parsed.objects] == [("Service", "demo", "web")] and not first.gone
    again = read_manifest(tmp_path, "a.yaml", known_content=first.content)
    assert again.same and again.parsed is None and not again.gone
    assert read_manifest(tmp_path, "gone.yaml").gone


@pytest.mark.parametrize(
    "make, problem",
    [
        pytest.param(lambda p: p.mkdir(), "x.yaml: not read: a directory, not a regular file", id="directory"),
        pytest.param(lambda p: p.write_bytes(b"kind: \xff"), "x.yaml: not UTF-8 text (byte 6: invalid start byte)",
                     id="not_utf8"),
        pytest.param(lambda p: p.write_text(many_services(5000) + "---\nkind: [\n"), "x.yaml: YAML syntax error at line",
                     id="large_file_checked_before_streaming"),
    ],
)
def test_read_manifest_failures_keep_the_files_objects(tmp_path, make, problem):
    make(tmp_path / "x.yaml")
    read = read_manifest(tmp_path, "x.yaml")
    assert read.parsed.failed and read.parsed.objects == ()
    assert read.parsed.problems[0].startswith(problem)


def test_large_file_streams_after_its_syntax_check(tmp_path):
    assert len(many_services(5000)) > STREAM_ABOVE_BYTES
    (tmp_path / "x.yaml").write_text(many_services(5000))
    read = read_manifest(tmp_path, "x.yaml")
    assert len(read.parsed.objects) == CHUNK_OBJECTS
    assert len(read.parsed.objects) + sum(len(c.objects) for c in read.rest) == 5000
