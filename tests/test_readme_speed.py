"""The README's speed table is the one bench/results.json gives (bench/readme_speed.py)."""

import json

from bench import readme_speed


def test_readme_table_matches_results_json():
    assert readme_speed.main(["--check"]) == 0


def test_table_names_each_figures_card_and_date_and_marks_missing_rows(tmp_path):
    data = {
        "gpu": "NVIDIA H100 80GB HBM3",
        "date": "2026-11-28 03:00 UTC",
        "yolov4_b32_pass_ms_fp16": 61.25,
        "torch_yolov4_b32_pass_ms_fp16": 40.0,
        "dp4_steady_speedup_fp16": 3.91,
        "measured": {
            "yolov4_b32_pass_ms_fp16": {
                "gpu": "NVIDIA H100 80GB HBM3",
                "date": "2026-11-28 03:00 UTC",
            },
            "dp4_steady_speedup_fp16": {"gpu": "4 x NVIDIA H200", "date": "2026-11-27 22:55 UTC"},
        },
    }
    lines = readme_speed.table(data)
    fp16 = next(line for line in lines if line.startswith("| yolov4 416 (3 classes)"))
    assert "| 61.2 ms | PyTorch AMP 40.0 ms | <= 45 | NVIDIA H100 80GB HBM3, 2026-11-28 |" in fp16
    dp = next(line for line in lines if "steady images/s, yolov4 fp16" in line)
    assert "3.910 x" in dp and "4 x NVIDIA H200, 2026-11-27" in dp
    b1 = next(line for line in lines if "batch 1, whole call" in line)
    assert "not measured" in b1


def test_rewrite_keeps_the_text_around_the_table(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\nbefore\n{readme_speed.START}\nold\n{readme_speed.END}\nafter\n")
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"gpu": "G", "date": "2026-11-28 03:00 UTC"}))
    assert readme_speed.main(["--json", str(results), "--readme", str(readme), "--check"]) == 1
    assert readme_speed.main(["--json", str(results), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# x\nbefore\n") and text.endswith(f"{readme_speed.END}\nafter\n")
    assert "old" not in text and "| work | darknet-py |" in text
    assert readme_speed.main(["--json", str(results), "--readme", str(readme), "--check"]) == 0
