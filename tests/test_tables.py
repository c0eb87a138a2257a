# SPDX-License-Identifier: Apache-2.0
"""One source for the tables C++, Cython and Python share: the C++ headers. tools/gen_tables.py writes
kvblocks/_tables.py (kvblocks.Status, kvblocks.OPTION_*), kvblocks/hixl/_tables.py (hixl's statuses,
options, FEATURE_*) and kvblocks/runtime/engine/option_keys.h (the keys Initialize accepts) from
include/llm_datadist/llm_datadist.h, include/kvblocks/ext_types.h and include/hixl/hixl_types.h. The
outputs are checked in; these tests fail when they drift from the headers."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEN = os.path.join(ROOT, "tools", "gen_tables.py")

pytestmark = pytest.mark.skipif(not os.path.exists(GEN), reason="not a source checkout")


def _gen():
    spec = importlib.util.spec_from_file_location("gen_tables", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _copy_sources(tmp_path):
    """The headers and generated files in a scratch tree, to break one of them there."""
    gen = _gen()
    for rel in (gen.LLM_H, gen.EXT_H, gen.HIXL_H, *gen.outputs()):
        os.makedirs(os.path.dirname(tmp_path / rel), exist_ok=True)
        shutil.copy(os.path.join(ROOT, rel), tmp_path / rel)
    return gen


def test_the_generated_tables_match_the_headers():
    r = subprocess.run([sys.executable, GEN, "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_new_option_in_the_header_makes_the_tables_stale(tmp_path):
    # Negative control: an option added to ext_types.h and not regenerated is drift the check names.
    gen = _copy_sources(tmp_path)
    ext = tmp_path / gen.EXT_H
    ext.write_text(ext.read_text().replace(
        "// kvblocks option keys (documented in the README).\n",
        '// kvblocks option keys (documented in the README).\nconstexpr const char OPTION_X[] = "kvblocks.X";\n'))
    assert sorted(gen.stale(str(tmp_path))) == sorted([gen.OUT_PY, gen.OUT_CC])
    assert 'OPTION_X = "kvblocks.X"' in gen.render_py(str(tmp_path))
    assert "    OPTION_X,\n" in gen.render_cc(str(tmp_path))


def test_a_changed_status_value_makes_the_tables_stale(tmp_path):
    gen = _copy_sources(tmp_path)
    llm = tmp_path / gen.LLM_H
    llm.write_text(llm.read_text().replace("LLM_KV_CACHE_NOT_EXIST = 0x5010B002U",
                                           "LLM_KV_CACHE_NOT_EXIST = 0x5010B0F2U"))
    assert gen.stale(str(tmp_path)) == [gen.OUT_PY]


def test_a_declaration_the_generator_cannot_read_is_an_error(tmp_path):
    # A key written another way (here: as a std::string_view) must stop the generator, not vanish.
    gen = _copy_sources(tmp_path)
    hixl = tmp_path / gen.HIXL_H
    hixl.write_text(hixl.read_text().replace('constexpr const char OPTION_AUTO_CONNECT[] = "AutoConnect";',
                                             'constexpr std::string_view OPTION_AUTO_CONNECT = "AutoConnect";'))
    with pytest.raises(SystemExit, match="OPTION_AUTO_CONNECT"):
        gen.outputs(str(tmp_path))


def _header_pairs(rel, pattern):
    with open(os.path.join(ROOT, rel)) as f:
        return re.findall(pattern, f.read(), re.M)


def test_python_sees_every_status_and_option_of_the_headers():
    import kvblocks as kb
    import kvblocks.hixl as hixl

    llm_h = "include/llm_datadist/llm_datadist.h"
    for name, value in _header_pairs(llm_h, r"^constexpr Status (LLM_\w+) = (0x\w+)U;"):
        assert kb.Status[name] == int(value, 16)
    for rel in (llm_h, "include/kvblocks/ext_types.h"):
        for name, key in _header_pairs(rel, r'^constexpr const char (OPTION_\w+)\[\] = "([^"]*)";'):
            assert getattr(kb, name) == key and name in kb.__all__
    for name, value in _header_pairs("include/hixl/hixl_types.h", r"^constexpr Status (\w+) = (\d+)U;"):
        assert getattr(hixl, name) == int(value) and name in hixl.__all__



def test_the_readme_documents_every_option_of_the_headers():
    # The README's Options table is prose, not generated: a key the headers gained must be added there.
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    table = readme[readme.index("### Options"):readme.index("\n### ", readme.index("### Options") + 1)]
    keys = [key for rel in ("include/llm_datadist/llm_datadist.h", "include/kvblocks/ext_types.h")
            for _, key in _header_pairs(rel, r'^constexpr const char (OPTION_\w+)\[\] = "([^"]*)";')]
    assert [k for k in keys if f"`{k}`" not in table] == []
