"""benchmarks/headroom.py: the head's weight overridden by token class (content strict, wording lenient)."""

from __future__ import annotations

import torch
from scripts import load_script

from diversed_hf import DiversedHead


def _round():
    # vocab of 4: ids 0, 1 are content tokens. Position 0: both models put their mass on content; position 1:
    # only on wording; position 2: the draft puts 0.1 on content (content at threshold 0.05).
    draft_probs = torch.tensor([[[0.5, 0.4, 0.05, 0.05], [0.0, 0.0, 0.5, 0.5], [0.05, 0.05, 0.3, 0.6]]])
    target_probs = torch.tensor([[[0.9, 0.1, 0.0, 0.0], [0.0, 0.0, 0.9, 0.1], [0.0, 0.0, 0.2, 0.8], [0.25] * 4]])
    return draft_probs, target_probs


def test_the_override_replaces_the_weight_on_its_class_only_and_never_reads_the_drafted_token():
    headroom = load_script("headroom")

    head = DiversedHead(features=["tv"], use_hidden_states=False, w_0=0.3)  # w = 0.3 everywhere before training
    mask = torch.tensor([1.0, 1.0, 0.0, 0.0])
    draft_probs, target_probs = _round()

    def weights(content_weight, wording_weight, draft_ids):
        verifier = headroom.TokenClassOverride(
            head, content_mask=mask, content_weight=content_weight, wording_weight=wording_weight
        )
        result = verifier(draft_ids, draft_probs, target_probs, generator=torch.Generator().manual_seed(0))
        return result.target_weight[0]

    for draft_ids in (torch.tensor([[0, 2, 3]]), torch.tensor([[3, 3, 0]])):  # the same weights for any drafted tokens
        assert torch.allclose(weights(None, None, draft_ids), torch.tensor([0.3, 0.3, 0.3]))
        assert torch.allclose(weights(1.0, None, draft_ids), torch.tensor([1.0, 0.3, 1.0]))
        assert torch.allclose(weights(None, 0.0, draft_ids), torch.tensor([0.3, 0.0, 0.3]))
        assert torch.allclose(weights(1.0, 0.0, draft_ids), torch.tensor([1.0, 0.0, 1.0]))


def test_content_mask_marks_the_tokens_matching_the_pattern():
    headroom = load_script("headroom")

    class Tokenizer:
        tokens = ["▁12", "▁Ben", "▁the", "=", "#"]

        def __len__(self):
            return len(self.tokens)

        def convert_ids_to_tokens(self, ids):
            return [self.tokens[i] for i in ids]

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [self.tokens.index("▁" + word) for word in text.split()]}

    mask = headroom.content_mask(Tokenizer(), 6, headroom.CONTENT_PATTERNS["arith"])
    assert mask.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]  # the model's extra (padding) id is not content
    mask = headroom.content_mask(Tokenizer(), 5, headroom.CONTENT_PATTERNS["summary"])
    assert mask.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    mask = headroom.content_mask(
        Tokenizer(), 5, headroom.CONTENT_PATTERNS["summary"], words=["the"]
    )  # a lowercase fact
    assert mask.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_make_results_puts_new_head_tables_into_the_page_and_keeps_the_rest(tmp_path):
    from diversed_hf.cli import sections as make_results

    page = tmp_path / "RESULTS.md"
    page.write_text(
        "# Benchmark results\n\n## arith\n\nbench\n\n## Head ablation: arith\n\nold table\n\n"
        "## Reading the tokens-per-round columns\n\nnotes\n"
    )
    results = tmp_path / "results"
    results.mkdir()
    (results / "ablation_arith.md").write_text("new table\n")
    (results / "front_arith.md").write_text("the front\n")
    (results / "headroom_summary.md").write_text("headroom\n")
    make_results.refresh_head_sections(page, results)
    text = page.read_text()
    assert "old table" not in text and text.count("## Head ablation: arith") == 1
    assert text.index("## arith") < text.index("new table") < text.index("## Headroom by token class: summary")
    assert text.index("## Acceptance-quality front: arith\n\nthe front") < text.index("new table")
    assert text.index("headroom") < text.index("## Reading") and text.endswith("notes\n")


def test_make_results_keeps_a_heads_selection_when_the_bench_replaces_its_results(tmp_path):
    import json

    make_results = load_script("make_results")

    current, new = tmp_path / "results.json", tmp_path / "results_arith.json"
    current.write_text(
        json.dumps(
            {
                "setting": {"task": "arith"},
                "rows": [{"method": "old"}],
                "selection": {"rule": "r", "chosen": "a", "front": [{"method": "a"}]},
            }
        )
    )
    new.write_text(json.dumps({"setting": {"task": "arith"}, "rows": [{"method": "new"}]}))
    written = json.loads(make_results._merged_results(new, current))
    assert written["rows"] == [{"method": "new"}] and written["selection"]["chosen"] == "a"
    (tmp_path / "bare.json").write_text(json.dumps({"rows": [{"method": "x"}]}))
    assert "selection" not in json.loads(make_results._merged_results(new, tmp_path / "bare.json"))
