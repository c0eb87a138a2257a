# SPDX-License-Identifier: Apache-2.0
"""Spec §5 cases 22-32: LinkLlmClusters / UnlinkLlmClusters / SetRole (CANN V2 rules, §3.4-3.6).

``link_llm_clusters`` returns the per-cluster statuses (``rets``) and raises only when the call
fails before per-cluster results exist (the overall status of C++ is then the raised code).
"""
import os
import sys

import pytest

import kvblocks as kb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import Pair, cluster, free_port  # noqa: E402
from test_spec_pull import Spec, expect  # noqa: E402

S = kb.Status


@pytest.fixture
def pair():
    p = Pair()
    yield p
    p.close()


def raises(status, fn, *args, **kwargs):
    with pytest.raises(kb.LLMException) as ei:
        fn(*args, **kwargs)
    assert ei.value.status_code == status
    return ei.value


def test_case22_timeout_not_positive(pair):
    raises(S.LLM_PARAM_INVALID, pair.d.link_llm_clusters, [cluster(1, pair.port)], 0)
    raises(S.LLM_PARAM_INVALID, pair.d.link_llm_clusters, [cluster(1, pair.port)], -5)
    raises(S.LLM_PARAM_INVALID, pair.d.unlink_llm_clusters, [cluster(1, pair.port)], 0)


def test_case23_empty_cluster_list(pair):
    raises(S.LLM_PARAM_INVALID, pair.d.link_llm_clusters, [])
    raises(S.LLM_PARAM_INVALID, pair.d.unlink_llm_clusters, [])


def test_case24_remote_ip_info_count(pair):
    local = [kb.IpInfo("127.0.0.1", 0)]
    remote = kb.IpInfo("127.0.0.1", pair.port)
    assert pair.d.link_llm_clusters([kb.ClusterInfo(1, 0, local, [])]) == [S.LLM_PARAM_INVALID]
    assert pair.d.link_llm_clusters([kb.ClusterInfo(1, 0, local, [remote, remote])]) == [S.LLM_PARAM_INVALID]
    # Without OPTION_LOCAL_COMM_RES, exactly one local ip info is needed too.
    assert pair.d.link_llm_clusters([kb.ClusterInfo(1, 0, [], [remote])]) == [S.LLM_PARAM_INVALID]
    assert pair.d.link_path(1) == ""


def test_case24_non_force_unlink_by_cluster_id_alone(pair):
    # kvblocks keys links by cluster id: like CANN's hixl backend, a non-force unlink needs no
    # remote_ip_info (CANN V2 needs exactly 1); two stay PARAM_INVALID and leave the link alone.
    pair.link()
    remote = kb.IpInfo("127.0.0.1", pair.port)
    assert pair.d.unlink_llm_clusters([kb.ClusterInfo(1, 0, [], [remote, remote])]) == [S.LLM_PARAM_INVALID]
    assert pair.d.link_path(1) != ""
    assert pair.d.unlink_llm_clusters([kb.ClusterInfo(1, 0, [kb.IpInfo("127.0.0.1", 0)], [])]) == \
        [S.LLM_SUCCESS]
    assert pair.d.link_path(1) == ""
    # The peer was told (a non-force unlink): its side is gone too, so it may link again.
    assert pair.d.unlink_llm_clusters([kb.ClusterInfo(1)]) == [S.LLM_SUCCESS]
    pair.link()


@pytest.mark.parametrize("ip", ["", "localhost", "1.2.3", "999.1.1.1", "::1"])
def test_case25_bad_ip(pair, ip):
    raises(S.LLM_PARAM_INVALID, pair.d.link_llm_clusters, [cluster(1, pair.port, ip=ip)])
    raises(S.LLM_PARAM_INVALID, pair.d.link_llm_clusters,
           [kb.ClusterInfo(1, 0, [kb.IpInfo(ip, 0)], [kb.IpInfo("127.0.0.1", pair.port)])])


def test_case26_nothing_listens(pair):
    assert pair.d.link_llm_clusters([cluster(1, free_port())]) == [S.LLM_LINK_FAILED]
    assert pair.d.link_path(1) == ""


def test_case27_link_twice(pair):
    pair.link()
    assert pair.d.link_llm_clusters([cluster(1, pair.port)]) == [S.LLM_ALREADY_LINK]
    assert pair.d.link_path(1) == "inprocess"


def test_case28_second_cluster_unreachable(pair):
    rets = pair.d.link_llm_clusters([cluster(1, pair.port), cluster(3, free_port())])
    assert rets == [S.LLM_SUCCESS, S.LLM_LINK_FAILED]
    assert pair.d.link_path(1) == "inprocess"
    rets = pair.d.link_llm_clusters([cluster(3, free_port()), cluster(1, pair.port)])
    assert rets == [S.LLM_LINK_FAILED, S.LLM_ALREADY_LINK]


def test_case29_set_role_while_linked(pair):
    pair.link()
    e = raises(S.LLM_EXIST_LINK, pair.d.set_role, kb.LlmRole.MIX)
    assert isinstance(e, kb.LinkError)
    # The accepting side holds the link as well.
    raises(S.LLM_EXIST_LINK, pair.p.set_role, kb.LlmRole.MIX,
           {kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{pair.port}"})
    assert pair.d.role == kb.LlmRole.DECODER
    assert pair.d.unlink_llm_clusters([cluster(1, pair.port)]) == [S.LLM_SUCCESS]
    pair.d.set_role(kb.LlmRole.MIX)
    assert pair.d.role == kb.LlmRole.MIX


def test_case29_force_unlink_is_local_only(pair):
    pair.link()
    assert pair.d.unlink_llm_clusters([cluster(1, pair.port)], force=True) == [S.LLM_SUCCESS]
    pair.d.set_role(kb.LlmRole.MIX)
    # P was not told: it still holds its side until it force-unlinks too (spec §3.6).
    raises(S.LLM_EXIST_LINK, pair.p.set_role, kb.LlmRole.MIX,
           {kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{pair.port}"})
    assert pair.p.unlink_llm_clusters([kb.ClusterInfo(2)], force=True) == [S.LLM_SUCCESS]
    pair.p.set_role(kb.LlmRole.MIX, {kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{pair.port}"})


def test_case30_set_role_sequence():
    d = kb.LlmDataDist(9, kb.LlmRole.DECODER)
    d.initialize({kb.OPTION_DEVICE_ID: "0"})
    try:
        port = free_port()
        listen = {kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{port}"}
        seq = [(kb.LlmRole.DECODER, {}), (kb.LlmRole.PROMPT, listen), (kb.LlmRole.DECODER, listen),
               (kb.LlmRole.MIX, {}), (kb.LlmRole.PROMPT, listen), (kb.LlmRole.PROMPT, {}),
               (kb.LlmRole.DECODER, listen), (kb.LlmRole.DECODER, {})]
        for role, opts in seq:
            d.set_role(role, opts)
            assert d.role == role
    finally:
        d.finalize()


def test_case30_set_role_listen_is_linkable():
    # SetRole with a listen address makes the instance a server others can link to.
    s = Spec(link=False)
    try:
        port = free_port()
        s.d.set_role(kb.LlmRole.MIX, {kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{port}"})
        s.p.set_role(kb.LlmRole.MIX)
        assert s.p.link_llm_clusters([cluster(2, port)]) == [S.LLM_SUCCESS]
        s.p.pull_kv_blocks(kb.CacheIndex(2, s.dc.cache_id), s.pc, [0], [1])
        assert (s.pa[:, 1] == s.da[:, 0]).all()
    finally:
        s.close()


def test_case30_set_role_invalid(pair):
    raises(S.LLM_PARAM_INVALID, pair.d.set_role, 4)
    raises(S.LLM_PARAM_INVALID, pair.d.set_role, kb.LlmRole.PROMPT, {kb.OPTION_LISTEN_IP_INFO: "127.0.0.1"})
    raises(S.LLM_PARAM_INVALID, pair.d.set_role, kb.LlmRole.PROMPT, {kb.OPTION_LISTEN_IP_INFO: "x:1"})
    assert pair.d.role == kb.LlmRole.DECODER


def test_case31_set_role_without_enable_option():
    # CANN V1 answers LLM_FEATURE_NOT_ENABLED without OPTION_ENABLE_SET_ROLE="1"; kvblocks follows
    # V2 (issue 2): SetRole works without it. The new role is the one the runtime enforces: with
    # kvblocks.RoleCheck=1 (V1 roles; the default "0" has no role checks) a Prompt may not pull, a
    # Mix or Decoder may.
    s = Spec(link=False, decoder_options={kb.OPTION_ROLE_CHECK: "1"})
    try:
        assert s.d.role == kb.LlmRole.DECODER
        s.d.set_role(kb.LlmRole.PROMPT)
        assert s.d.role == kb.LlmRole.PROMPT
        s.link()
        expect(s, S.LLM_PARAM_INVALID, s.pull, [0], [0])
        assert s.d.unlink_llm_clusters([cluster(1, s.pair.port)]) == [S.LLM_SUCCESS]
        s.d.set_role(kb.LlmRole.MIX)
        assert s.d.role == kb.LlmRole.MIX
        s.link()
        s.pull([1], [1])
        assert (s.da[:, 1] == s.pa[:, 1]).all()
        assert s.d.unlink_llm_clusters([cluster(1, s.pair.port)]) == [S.LLM_SUCCESS]
        s.d.set_role(kb.LlmRole.DECODER)
        assert s.d.role == kb.LlmRole.DECODER
    finally:
        s.close()


@pytest.mark.parametrize("force", [True, False])
def test_case32_unlink_never_linked(pair, force):
    assert pair.d.unlink_llm_clusters([cluster(7, free_port())], force=force) == [S.LLM_SUCCESS]


def test_case32_force_unlink_without_ip_infos(pair):
    assert pair.d.unlink_llm_clusters([kb.ClusterInfo(7)], force=True) == [S.LLM_SUCCESS]


def test_unlink_then_pull_then_relink():
    s = Spec()
    try:
        assert s.d.unlink_llm_clusters([cluster(1, s.pair.port)]) == [S.LLM_SUCCESS]
        expect(s, S.LLM_NOT_YET_LINK, s.pull, [0], [0])
        expect(s, S.LLM_NOT_YET_LINK, s.push, [0], [0])
        s.link()
        s.pull([1], [1])
        assert (s.da[:, 1] == s.pa[:, 1]).all()
    finally:
        s.close()


def test_link_usable_both_ways():
    # Spec §3.5: after D links to P, D can pull from P and P can push to D.
    s = Spec()
    try:
        s.pull([0], [0])
        s.push([3], [3])
        assert (s.da[:, 0] == s.pa[:, 0]).all() and (s.da[:, 3] == s.pa[:, 3]).all()
    finally:
        s.close()


def test_link_without_listener_on_server_side():
    # Linking is one-sided: the peer must listen. D does not listen, so P cannot link to it.
    s = Spec(link=False)
    try:
        assert s.p.link_llm_clusters([cluster(2, free_port())]) == [S.LLM_LINK_FAILED]
    finally:
        s.close()


def test_link_rets_types(pair):
    rets = pair.d.link_llm_clusters([cluster(1, pair.port)])
    assert rets == [0] and isinstance(rets[0], kb.Status)
    with pytest.raises(TypeError):
        pair.d.link_llm_clusters(cluster(1, pair.port))
    with pytest.raises(TypeError):
        pair.d.link_llm_clusters([1])


def test_local_comm_res_lets_a_cluster_omit_local_ip_infos():
    """Spec §3.5: local_ip_infos must hold exactly one entry only when llm.LocalCommRes is absent."""
    port = free_port()
    p = kb.LlmDataDist(1, kb.LlmRole.PROMPT)
    p.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{port}"})
    without = kb.LlmDataDist(3, kb.LlmRole.DECODER)
    without.initialize({kb.OPTION_DEVICE_ID: "0"})
    with_res = kb.LlmDataDist(2, kb.LlmRole.DECODER)
    with_res.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LOCAL_COMM_RES: ""})
    try:
        bare = kb.ClusterInfo(1, 0, [], [kb.IpInfo("127.0.0.1", port)])
        assert without.link_llm_clusters([bare]) == [kb.Status.LLM_PARAM_INVALID]
        assert with_res.link_llm_clusters([bare]) == [kb.Status.LLM_SUCCESS]
    finally:
        with_res.finalize()
        without.finalize()
        p.finalize()
