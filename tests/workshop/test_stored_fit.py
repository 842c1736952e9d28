import json

from scaledl.workshop import stored_fit

LINE = "- measured here: alpha 105 us, beta 6.27 GB/s on 2 cpu ranks; 6 of 6 sizes within 30% of the model\n"


def notebook(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    cell = {"cell_type": "code", "source": "", "outputs": [{"output_type": "stream", "name": "stdout", "text": text}]}
    path.write_text(json.dumps({"cells": [cell]}))


def test_the_learners_own_lesson_3_comes_first(tmp_path, capsys):
    notebook(tmp_path / "solutions" / "03_collectives.ipynb", LINE.replace("105", "999"))
    notebook(tmp_path / "exercises" / "03_collectives.ipynb", LINE)
    fit = stored_fit.lesson_3(folder=tmp_path / "exercises")
    assert (round(fit.alpha_s * 1e6), round(fit.bandwidth_Bps / 1e9, 2)) == (105, 6.27)
    assert fit.which == "your own lesson 3's 2-rank CPU fit (03_collectives.ipynb)"
    assert capsys.readouterr().out == f"lesson 3's link: {fit.which}\n"


def test_else_the_shipped_one_and_it_says_so(tmp_path, capsys):
    notebook(tmp_path / "solutions" / "03_collectives.ipynb", LINE)
    notebook(tmp_path / "exercises" / "03_collectives.ipynb", "not run yet\n")
    fit = stored_fit.lesson_3(folder=tmp_path / "exercises")
    assert round(fit.alpha_s * 1e6) == 105 and fit.which.startswith("the shipped 2-rank CPU fit")
    assert "run lesson 3 here" in capsys.readouterr().out


def test_none_where_no_lesson_3_holds_a_fit(tmp_path, capsys):
    notebook(tmp_path / "exercises" / "03_collectives.ipynb", "not run yet\n")
    assert stored_fit.lesson_3(folder=tmp_path / "exercises") is None
    assert "neither" in capsys.readouterr().out
