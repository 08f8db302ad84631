"""The vLLM plugin's settings (``additional_config["diversed"]``): checked without vLLM, in the main suite."""

import pytest
import torch

from diversed_hf import testbed
from diversed_hf.verifiers import HeadVerifier, StaticEnsembleVerifier
from diversed_hf.vllm_plugin.settings import request_rule, settings_from_additional_config


def test_no_diversed_entry_means_the_engine_is_vllms_own():
    assert settings_from_additional_config({}) is None
    assert settings_from_additional_config({"other_plugin": 1}) is None


def test_a_static_weight_builds_the_static_ensemble_verifier():
    settings = settings_from_additional_config({"diversed": {"target_weight": 0.25}})
    verifier, identity = settings.build_verifier()
    assert verifier == StaticEnsembleVerifier(0.25)
    assert "target_weight=0.25" in identity


@pytest.mark.parametrize(
    "values, message",
    [
        ({}, "exactly one of `target_weight`"),
        ({"target_weight": 0.5, "head": "x"}, "exactly one of `target_weight`"),
        ({"target_weight": 1.5}, r'\["target_weight"\] must be a number in \[0, 1\]'),
        ({"target_weight": "0.5"}, r'\["target_weight"\] must be a number'),
        ({"target_weight": 0.5, "mixing": "geometric"}, r'\["mixing"\] must be one of'),
        ({"head": "x", "mixing": "logits"}, "a head mixes in its own config's space"),
        ({"target_weight": 0.5, "weight": 1}, r"unknown keys \['weight'\]"),
    ],
)
def test_bad_settings_name_the_key_and_the_fix(values, message):
    with pytest.raises(ValueError, match=message):
        settings_from_additional_config({"diversed": values})


def test_settings_must_be_an_object():
    with pytest.raises(ValueError, match="must be a JSON object"):
        settings_from_additional_config({"diversed": 0.5})


def test_a_head_on_hidden_states_loads_when_its_sizes_are_the_engines():
    settings = settings_from_additional_config({"diversed": {"head": str(testbed.asset_path("heads/arith"))}})
    verifier, identity = settings.build_verifier(target_hidden_size=192, draft_hidden_size=128)
    assert isinstance(verifier, HeadVerifier) and verifier.requires_hidden_states
    assert "reads hidden states and features=" in identity
    with pytest.raises(ValueError, match=r"reads the draft's hidden states of size 128.*hidden size 64"):
        settings.build_verifier(target_hidden_size=192, draft_hidden_size=64)


def test_named_heads_load_once_and_requests_pick_them_by_name():
    arith, summary = str(testbed.asset_path("heads/arith")), str(testbed.asset_path("heads/summary"))
    settings = settings_from_additional_config(
        {"diversed": {"target_weight": 1.0, "heads": {"arith": arith, "summary": {"head": summary}}}}
    )
    rules, identity = settings.build_rules(target_hidden_size=192, draft_hidden_size=128)
    assert rules.default == StaticEnsembleVerifier(1.0) and rules.requires_hidden_states
    assert "requests may pick the heads arith=" in identity and "summary=" in identity
    assert rules.for_request(None) is rules.default and rules.for_request({"other": 1}) is rules.default
    assert rules.for_request({"diversed": {"head": "arith"}}) is rules.heads["arith"]
    assert rules.for_request({"diversed": {"head": "summary"}}).head.config.task == "summary"
    assert rules.for_request({"diversed": {"target_weight": 0.3}}) == StaticEnsembleVerifier(0.3)
    assert rules.for_request({"diversed": {"target_weight": 0.3}}) is rules.for_request(
        {"diversed": {"target_weight": 0.3}}
    )
    assert rules.for_request({"diversed": {"target_weight": 0.3, "mixing": "logits"}}).mixing == "logits"


def test_the_default_head_is_picked_by_its_source():
    arith = str(testbed.asset_path("heads/arith"))
    rules, _ = settings_from_additional_config({"diversed": {"head": arith}}).build_rules()
    assert rules.for_request({"diversed": {"head": arith}}) is rules.default


@pytest.mark.parametrize(
    "values, message",
    [
        (0.5, r'extra_args\["diversed"\] must be a JSON object'),
        ({}, "exactly one of `target_weight` and `head`"),
        ({"target_weight": 0.5, "head": "arith"}, "exactly one of"),
        ({"target_weight": 2}, r'extra_args\["diversed"\]\["target_weight"\] must be a number in \[0, 1\]'),
        ({"target_weight": float("nan")}, r'\["target_weight"\] must be a number'),
        ({"target_weight": True}, r'\["target_weight"\] must be a number'),
        ({"target_weight": 0.5, "mixing": "max"}, r'\["mixing"\] must be one of'),
        ({"head": "arith", "mixing": "logits"}, r'\["mixing"\] is for `target_weight`'),
        ({"head": "xsum"}, r"""\["head"\] must name a head this engine loaded \(\['arith'\]"""),
        ({"weight": 0.5}, r"unknown keys \['weight'\]"),
        ({"fuzzy": {"threshold": -1}}, r'\["fuzzy"\]: `threshold` must be a non-negative number, got -1'),
        ({"fuzzy": {"threshold": 0.1}, "target_weight": 0.5}, r"names 'fuzzy' with \['target_weight'\]"),
        ({"fuzzy": 0.1}, r'\["fuzzy"\] must be a JSON object with the keys \[\'threshold\', \'divergence\'\]'),
        ({"top_k_relaxed": {"top_k": 2}}, r"needs \['delta'\]"),
        ({"top_k_relaxed": {"top_k": -2, "delta": 0.5}}, r"`top_k` must be a non-negative integer, got -2"),
    ],
)
def test_bad_request_rules_name_the_key(values, message):
    settings = settings_from_additional_config({"diversed": {"target_weight": 1.0, "heads": {"arith": "dir"}}})
    with pytest.raises(ValueError, match=message):
        request_rule({"diversed": values}, settings)


def test_a_request_rule_on_an_engine_without_diversed_is_refused():
    assert request_rule({"other": 1}, None) is None
    with pytest.raises(ValueError, match=r"verifies with vLLM's own rule: start it with additional_config"):
        request_rule({"diversed": {"target_weight": 1.0}}, None)


@pytest.mark.parametrize(
    "heads, message",
    [
        ({}, r'\["heads"\] must be a non-empty JSON object'),
        ({"a": 3}, r"""\["heads"\]\['a'\] must be a head's source"""),
        ({"a": {"head": "x", "rev": "1"}}, r"unknown keys \['rev'\]"),
        ({"a": {"head": ""}}, r'\["head"\] must be a directory or a Hub repo id'),
    ],
)
def test_bad_named_heads_name_the_key(heads, message):
    with pytest.raises(ValueError, match=message):
        settings_from_additional_config({"diversed": {"target_weight": 1.0, "heads": heads}})


def test_a_features_only_head_loads_with_its_identity(tmp_path):
    from diversed_hf import DiversedHead

    head = DiversedHead(use_hidden_states=False, features=["tv", "draft_top1"])
    head.save_pretrained(tmp_path)
    verifier, identity = settings_from_additional_config({"diversed": {"head": str(tmp_path)}}).build_verifier()
    assert isinstance(verifier, HeadVerifier)
    assert torch.equal(verifier.head.net[-1].weight, head.net[-1].weight)
    assert str(tmp_path) in identity and "features=['tv', 'draft_top1']" in identity and "weights sha256=" in identity


def test_a_named_head_may_not_rename_the_default_head():
    """``{"head": A, "heads": {A: B}}`` would verify requests naming A with B while the logs say A: refused."""
    with pytest.raises(ValueError, match=r"""\["heads"\]\['a'\] is 'b' .*\["head"\] 'a'.*Rename the entry"""):
        settings_from_additional_config({"diversed": {"head": "a", "heads": {"a": "b"}}})
    with pytest.raises(ValueError, match="revision 'v2'.*revision None"):
        settings_from_additional_config({"diversed": {"head": "a", "heads": {"a": {"head": "a", "revision": "v2"}}}})
    same = settings_from_additional_config({"diversed": {"head": "a", "heads": {"a": "a", "other": "b"}}})
    assert same.head_sources == {"a": ("a", None), "other": ("b", None)}


def test_an_engine_keeps_a_bounded_number_of_static_rules():
    """A client may send any weight: the engine keeps the most recently used few verifiers, not one per weight."""
    from diversed_hf.vllm_plugin.settings import MAX_CACHED_RULES, VerificationRules

    settings = settings_from_additional_config({"diversed": {"target_weight": 1.0}})
    rules = VerificationRules(settings, {}, max_cached=4)
    for i in range(1000):
        verifier = rules.for_request({"diversed": {"target_weight": i / 1000}})
        assert verifier == StaticEnsembleVerifier(i / 1000)
        assert len(rules._verifiers) <= 4
    assert rules.for_request({"diversed": {"target_weight": 0.999}}) is verifier  # recent ones are shared
    assert rules.for_request({"diversed": {"target_weight": 1.0}}) is rules.default
    assert rules.for_request(None) is rules.default and rules.default == StaticEnsembleVerifier(1.0)
    assert VerificationRules(settings, {}).max_cached == MAX_CACHED_RULES
    with pytest.raises(ValueError, match="`max_cached` must be a positive integer"):
        VerificationRules(settings, {}, max_cached=0)


def test_requests_pick_the_relaxed_rules_which_verify_through_the_mixture():
    """Fuzzy SD and top-k relaxed acceptance per request; the mixture the plugin verifies against is each rule's pi
    (top-k: its emitted law o, whose speculative sampling is the rule: accepted outright inside the relaxed set)."""
    from diversed_hf.verifiers import FuzzyVerifier, TopKRelaxedVerifier, ops
    from diversed_hf.vllm_plugin.mixture import mixture_verification

    settings = settings_from_additional_config({"diversed": {"target_weight": 1.0}})
    rules, _ = settings.build_rules()
    fuzzy = rules.for_request({"diversed": {"fuzzy": {"threshold": 0.2, "divergence": "tv"}}})
    top_k = rules.for_request({"diversed": {"top_k_relaxed": {"top_k": 2, "delta": 1.0}}})
    assert fuzzy == FuzzyVerifier(0.2, "tv") and top_k == TopKRelaxedVerifier(2, 1.0)
    assert rules.for_request({"diversed": {"fuzzy": {"threshold": 0.2, "divergence": "tv"}}}) is fuzzy  # cached
    q = torch.tensor([[0.6, 0.3, 0.1, 0.0], [0.1, 0.1, 0.1, 0.7]])
    p = torch.tensor([[0.5, 0.3, 0.1, 0.1], [0.7, 0.2, 0.05, 0.05]])
    nu, residual = mixture_verification([fuzzy, top_k], [1, 1], q, p)
    assert torch.equal(nu[0], q[0])  # TV 0.1 < 0.2: pi = q
    acceptance = ops.ratio_acceptance(q[1], nu[1])
    expected = top_k.token_acceptance(q[1:], p[1:], None)[0]
    torch.testing.assert_close(acceptance, expected)  # ratio acceptance against o is the rule's own
    torch.testing.assert_close(residual[1], top_k.residual_probs(q[1], p[1], None))


@pytest.fixture
def judge_dir(tmp_path):
    """A judge for the testbed target whose weights make it fire on states with a positive first coordinate."""
    from diversed_hf.heads.judge import JudgeHead

    judge = JudgeHead(192, task="arith")  # the testbed target's width
    with torch.no_grad():
        judge.linear.weight.zero_()
        judge.linear.weight[0, 0] = 50.0
        judge.linear.bias.zero_()
    judge.save_pretrained(tmp_path / "judge")
    return str(tmp_path / "judge")


def test_requests_pick_a_loaded_judge_whose_rule_verifies_through_the_mixture(judge_dir):
    """A judge is a mixture in the engine: pi_t = q_t where it fires on the target's state after the drafted token,
    else p_t; its threshold comes with the request (0.5 by default), and each threshold is its own cached rule."""
    from diversed_hf.verifiers import JudgeVerifier
    from diversed_hf.vllm_plugin.mixture import mixture_rejection_sample, mixture_verification

    settings = settings_from_additional_config({"diversed": {"target_weight": 1.0, "judges": {"arith": judge_dir}}})
    rules, identity = settings.build_rules(target_hidden_size=192)
    assert "requests may pick the judges arith=" in identity and rules.requires_hidden_states
    assert not rules.reads_draft_hidden  # an EAGLE-3 engine may load judges
    judge = rules.for_request({"diversed": {"judge": "arith"}})
    assert isinstance(judge, JudgeVerifier) and judge.threshold == 0.5
    assert rules.for_request({"diversed": {"judge": {"name": "arith", "threshold": 0.5}}}) is judge
    for i in range(3 * rules.max_cached):  # a client may send any threshold: the engine keeps a bounded number
        rules.for_request({"diversed": {"judge": {"name": "arith", "threshold": 0.5 + i / 1000}}})
    assert len(rules._verifiers) == rules.max_cached
    never = rules.for_request({"diversed": {"judge": {"name": "arith", "threshold": 1.5}}})
    q = torch.tensor([[0.6, 0.3, 0.1, 0.0], [0.1, 0.1, 0.1, 0.7], [0.1, 0.1, 0.1, 0.7]])
    p = torch.tensor([[0.1, 0.3, 0.5, 0.1], [0.7, 0.2, 0.05, 0.05], [0.7, 0.2, 0.05, 0.05]])
    after = torch.zeros(3, judge.judge.config.hidden_size)
    after[0, 0], after[1, 0], after[2, 0] = 1.0, -1.0, 1.0  # fires at positions 0 and 2
    nu, _ = mixture_verification([judge, never], [2, 1], q, p, judge_hidden=after)
    assert torch.equal(nu[0], q[0]) and torch.equal(nu[1], p[1]) and torch.equal(nu[2], p[2])
    with pytest.raises(RuntimeError, match="A judge got no hidden states"):
        mixture_verification([judge], [3], q, p)
    # greedy: drafts are argmax q; the judge keeps the first (a mismatch with argmax p) and the target decides next
    output = mixture_rejection_sample(
        [judge],
        torch.tensor([0, 3, 3]),
        [3],
        3,
        q,
        p.log(),
        torch.tensor([[1]]),
        torch.tensor([True]),
        torch.zeros(3),
        torch.ones(1, 4),
        judge_hidden=after,
    )
    assert output.tolist() == [[0, 0, -1, -1]]  # kept by the judge, then argmax p where it does not fire


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"judge": "summary"}, r'\["judge"\] must name a judge this engine loaded \(\[\'arith\'\]'),
        ({"judge": {"name": "arith", "threshold": -0.1}}, r'\["threshold"\] must be a non-negative number'),
        ({"judge": {"name": "arith", "t": 0.5}}, r'\["judge"\] must be a loaded judge\'s name or'),
        ({"judge": "arith", "target_weight": 0.5}, r"names 'judge' with \['target_weight'\]"),
    ],
)
def test_bad_judge_requests_name_the_key(judge_dir, extra, message):
    settings = settings_from_additional_config({"diversed": {"target_weight": 1.0, "judges": {"arith": judge_dir}}})
    with pytest.raises(ValueError, match=message):
        request_rule({"diversed": extra}, settings)


def test_a_judge_for_another_width_is_refused_at_start(judge_dir):
    settings = settings_from_additional_config({"diversed": {"target_weight": 1.0, "judges": {"arith": judge_dir}}})
    with pytest.raises(ValueError, match=r"the judge 'arith' .* reads the target's hidden states of size \d+"):
        settings.build_rules(target_hidden_size=7)
    with pytest.raises(ValueError, match=r'\["judges"\]\[\'arith\'\] has unknown keys \[\'head\'\]'):
        settings_from_additional_config({"diversed": {"target_weight": 1.0, "judges": {"arith": {"head": "x"}}}})
