"""Task loaders on small local files in the Hub datasets' schemas."""

from __future__ import annotations

import json

import pytest

from diversed_hf.lab.tasks import load_task_dataset

GSM8K = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "Ann has 10 pens and loses 2. How many?", "answer": "10 - 2 = <<10-2=8>>8\n#### 8"},
    {"question": "Ben has 2 bags of 5. How many?", "answer": "2 * 5 = <<2*5=10>>10\n#### 10"},
]
CNN = [{"article": "The mayor opened a park on Monday. It has trees.", "highlights": "Mayor opens park.", "id": "a"}]
XSUM = [{"document": "A team won the cup after a long final.", "summary": "Team wins cup.", "id": "1"}]
MBPP = [
    {
        "task_id": 2,
        "text": "Write a function to add two numbers.",
        "code": "def add(a, b):\n    return a + b",
        "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
        "test_setup_code": "",
        "challenge_test_list": [],
    }
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gsm8k_zero_and_few_shot(tmp_path):
    data = write_jsonl(tmp_path / "test.jsonl", GSM8K)
    dataset = load_task_dataset("gsm8k", data_files=data)
    assert dataset[0]["prompt"] == "Question: Tom has 3 apples and buys 4. How many?\nAnswer:"
    assert dataset[0]["reference"] == "3 + 4 = <<3+4=7>>7\n#### 7"
    shots = write_jsonl(tmp_path / "train.jsonl", GSM8K[1:])
    few = load_task_dataset("gsm8k", data_files=data, num_shots=2, shots_data_files=shots)
    assert few[0]["prompt"] == (
        "Question: Ann has 10 pens and loses 2. How many?\nAnswer: 10 - 2 = 8\n#### 8\n\n"
        "Question: Ben has 2 bags of 5. How many?\nAnswer: 2 * 5 = 10\n#### 10\n\n"
        "Question: Tom has 3 apples and buys 4. How many?\nAnswer:"
    )


def test_num_examples_is_a_seeded_subset(tmp_path):
    data = write_jsonl(tmp_path / "test.jsonl", GSM8K)
    first = load_task_dataset("gsm8k", data_files=data, num_examples=2, seed=3)
    again = load_task_dataset("gsm8k", data_files=data, num_examples=2, seed=3)
    assert len(first) == 2 and first["prompt"] == again["prompt"]
    with pytest.raises(ValueError, match="has only 3 rows"):
        load_task_dataset("gsm8k", data_files=data, num_examples=5)


def test_summaries(tmp_path):
    cnn = load_task_dataset("cnn_dailymail", data_files=write_jsonl(tmp_path / "cnn.jsonl", CNN), max_source_words=4)
    assert cnn[0]["prompt"] == "Article: The mayor opened a\nSummary:"
    assert cnn[0]["reference"] == "Mayor opens park."
    xsum = load_task_dataset("xsum", data_files=write_jsonl(tmp_path / "xsum.jsonl", XSUM))
    assert xsum[0]["prompt"] == "Article: A team won the cup after a long final.\nSummary:"
    assert xsum[0]["reference"] == "Team wins cup."


def test_mbpp_prompt_and_tests(tmp_path):
    mbpp = load_task_dataset("mbpp", data_files=write_jsonl(tmp_path / "mbpp.jsonl", MBPP))
    assert mbpp[0]["prompt"] == (
        "You are an expert Python programmer, and here is your task: Write a function to add two numbers. "
        "Your code should pass these tests:\n\nassert add(1, 2) == 3\nassert add(0, 0) == 0\n[BEGIN]\n"
    )
    assert mbpp[0]["reference"] == "assert add(1, 2) == 3\nassert add(0, 0) == 0"


def test_parquet_files(tmp_path):
    from datasets import Dataset

    path = tmp_path / "xsum.parquet"
    Dataset.from_list(XSUM).to_parquet(str(path))
    assert load_task_dataset("xsum", data_files=str(path))[0]["reference"] == "Team wins cup."


def test_missing_columns_are_named(tmp_path):
    data = write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "solution": "#### 1"}])
    with pytest.raises(ValueError, match=r"lacks the columns \['answer'\]"):
        load_task_dataset("gsm8k", data_files=data)


def test_bad_requests(tmp_path):
    data = write_jsonl(tmp_path / "test.jsonl", GSM8K)
    with pytest.raises(ValueError, match="needs `shots_data_files`"):
        load_task_dataset("gsm8k", data_files=data, num_shots=1)
    with pytest.raises(ValueError, match="Unknown task 'squad'; registered tasks are"):
        load_task_dataset("squad", data_files=data)
    with pytest.raises(ValueError, match=r"does not take the options \['data_files'\]"):
        load_task_dataset("testbed_arith", data_files=data)
    with pytest.raises(FileNotFoundError):
        load_task_dataset("gsm8k", data_files=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="must all be one of"):
        load_task_dataset("gsm8k", data_files=str(tmp_path / "data.txt"))


def test_testbed_tasks():
    dataset = load_task_dataset("testbed_arith", split="train", num_examples=3, seed=0)
    assert len(dataset) == 3 and dataset[0]["prompt"].startswith("Question:")
    assert "reference" in dataset.column_names
