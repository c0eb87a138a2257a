# SPDX-License-Identifier: Apache-2.0
"""kvblocks bench --against: the regression guard runs both builds in real worker processes."""
import pytest

from kvblocks_bench import against


def test_against_a_built_folder_compares_every_case_of_the_path():
    here = against.current()
    res = against.run(here, rounds=2, paths=("shm",), quick=True, progress=False)
    assert res["meta"]["ref_folder"] == here and res["meta"]["rounds"] == 2
    assert sorted(res["cases"]) == ["shm/large/pull", "shm/large/push", "shm/small/pull", "shm/small/push"]
    for c in res["cases"].values():
        assert c["rounds"] == 2 and 0 < c["ratio_min"] <= c["ratio"] <= c["ratio_max"]
        assert c["verdict"] in ("SLOWER", "faster", "parity")
    text = against.report(res)
    assert "shm/small/pull" in text and "alternating rounds" in text


def test_against_names_what_it_cannot_use(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="no built kvblocks package"):
        against.prepare(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # not a git checkout: a name is neither a wheel, a folder nor a commit
    with pytest.raises(ValueError, match="not a wheel, a built folder or a git commit"):
        against.prepare("no-such-ref-anywhere")
