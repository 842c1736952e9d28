"""The lessons as a learner meets them: one path, live cells right on a GPU node, hints that
point to the idea, exercises that fail where they are left, answers to every question, and
figures stored with the outputs."""
import ast
import re

import nbformat
import pytest

from conftest import ROOT, lesson_and_deeper
from scaledl.workshop.exercises import BEGIN, END

SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb")) + SOLUTIONS
# Each lesson's companion: its library internals, the same steps without scaledl, side analyses (markdown only).
DEEPER = sorted((ROOT / "notebooks" / "deeper").glob("*.ipynb"))


def cells(path, kind="code"):
    return [cell for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == kind]


def live(path):
    return [cell.source.split("\n", 1)[1] for cell in cells(path) if cell.source.startswith("%%px")]


def table_rows(text: str) -> list[list[str]]:
    return [[part.strip() for part in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| ---")]


def test_one_table_lists_every_lesson_in_order():
    rows = table_rows((ROOT / "notebooks" / "README.md").read_text())[1:]
    assert [row[0] for row in rows] == [str(n) for n in range(15)]
    for row in rows:
        number, link = int(row[0]), re.search(r"\]\(([^)]+)\)", row[1]).group(1)
        opened = (ROOT / "notebooks" / link).resolve()
        assert opened.exists(), link
        assert opened.name.startswith(f"{number:02d}_"), (number, link)
        folder = "notebooks" if number == 0 else "exercises"  # the learner works in exercises/
        assert opened.parent.name == folder, link
        if number:
            assert (ROOT / "solutions" / opened.name).exists()
    assert {p.name for p in SOLUTIONS} == {p.name for p in EXERCISES}
    assert len(SOLUTIONS) == 14
    assert "notebooks/README.md" in (ROOT / "README.md").read_text().split("## Notebooks", 1)[1]


def test_the_ladder_tables_lesson_column_names_lessons_that_run_the_rung():
    readme = (ROOT / "README.md").read_text()
    ladder = readme.split("## The ladder", 1)[1].split("\n\n", 2)[1]
    rows = table_rows(ladder)
    assert rows[0][-1] == "lesson"
    for row in rows[1:]:
        module = row[1].strip("`")
        for number in row[-1].split(","):
            lesson = next((ROOT / "solutions").glob(f"{int(number):02d}_*.ipynb"))
            assert module in lesson.read_text(), (module, lesson.name)


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem)
def test_every_lesson_opens_with_a_parameters_cell(path):
    first = cells(path)[0]
    assert "parameters" in first.metadata.get("tags", []), path.name
    assert re.match(r"[A-Z_]+ = ", first.source), first.source


CREATES = re.compile(r"\b(torch\.(randn|zeros|ones|full|tensor|empty|randint)|models\.torch_cnn|TwoHeads)\(")


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem)
def test_live_cells_keep_models_and_tensors_on_the_ranks_device(path):
    for source in live(path):
        for line in source.splitlines():
            if not CREATES.search(line) or "device" in line or ".to(" in line or line.startswith("class "):
                continue
            names = re.findall(r"\w+", line.split("=")[0]) if "=" in line.split("(")[0] else []
            moved = [name for name in names if re.search(rf"{name}\b[^\n=]*\)?\.to\(|\b{name}\.to\(", source)
                     or re.search(rf"\((?:[^()]|\([^()]*\))*\b{name}\b(?:[^()]|\([^()]*\))*\)\.to\(", source)]
            assert names and moved, f"{path.name}: not on dist.device: {line.strip()}"
        for call in re.findall(r"DDP\([^\n]*", source):
            assert "device_ids" in call, f"{path.name}: {call}"


def test_tensorflow_ranks_each_pin_their_own_gpu():
    source = "\n".join(live(ROOT / "solutions" / "04_horovod_tf.ipynb"))
    assert "set_visible_devices" in source and "local_rank" in source and "set_memory_growth" in source


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem)
def test_live_ranks_start_through_the_engine_helper(path):
    if live(path):
        text = "".join(cell.source for cell in cells(path))
        assert "engines.start(WORLD_SIZE)" in text and "ipp.Cluster" not in text


def solution_blocks(path):
    for cell in cells(path):
        lines, block, hint = cell.source.splitlines(), None, None
        for line in lines:
            if BEGIN.match(line):
                block, hint = [], (BEGIN.match(line).group("hint") or "")
            elif END.match(line):
                yield hint, "\n".join(block), cell.source
                block = None
            elif block is not None:
                block.append(line)


BUILTINS = {"list", "range", "sum", "len", "float", "int", "min", "max", "print", "dict", "zip", "enumerate",
            "backward", "step", "zero_grad", "item"}  # the plain loop's own calls, known from lesson 2


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda path: path.stem)
def test_hints_point_to_the_idea_without_spelling_the_call(path):
    notebook_text = path.read_text()
    blocks = list(solution_blocks(path))
    assert blocks, path.name
    for hint, block, _ in blocks:
        assert len(hint) > 20, (path.name, hint)
        for qualified in re.findall(r"([A-Za-z_][\w.]*)\(", block):
            parts = qualified.split(".")
            name = parts[-1]
            if name in BUILTINS or (len(parts) == 1 and re.search(rf"\b{name} = |def {name}\(", notebook_text)):
                continue  # a variable or function of the lesson itself
            assert not re.search(rf"\b{re.escape(name)}\b", hint), f"{path.name}: the hint names {qualified}: {hint}"


def raises_where_it_stands(source: str) -> bool:
    """The exercise's raise runs when the cell runs: not inside a function the cell never calls."""
    tree = ast.parse(source.replace("%%px\n", "", 1))
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    for function in [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]:
        raises = [node for node in ast.walk(function) if isinstance(node, ast.Raise)]
        if raises and function.name not in called:
            return False
    return True


@pytest.mark.parametrize("path", EXERCISES, ids=lambda path: path.stem)
def test_an_untouched_exercise_raises_in_its_own_cell(path):
    exercises = [cell.source for cell in cells(path) if "raise NotImplementedError" in cell.source]
    assert exercises, path.name
    for source in exercises:
        assert raises_where_it_stands(source), f"{path.name}: the raise hides in an uncalled function:\n{source}"


def test_the_raise_check_catches_a_raise_inside_an_uncalled_function():
    assert not raises_where_it_stands("def f():\n    raise NotImplementedError\n")
    assert raises_where_it_stands("def f():\n    raise NotImplementedError\nprint(f())\n")
    assert raises_where_it_stands("%%px\nfor i in range(3):\n    raise NotImplementedError\n")


def numbered(text: str) -> int:
    return len(re.findall(r"^\d+\. ", text, flags=re.M))


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda path: path.stem)
def test_every_question_has_an_answer_in_the_solution_only(path):
    markdown = cells(path, "markdown")
    questions = [c for c in markdown if c.source.startswith("## Check your understanding")]
    answers = [c for c in markdown if "answers" in c.metadata.get("tags", [])]
    assert len(questions) == 1 and len(answers) == 1, path.name
    assert numbered(questions[0].source) == numbered(answers[0].source) >= 3
    exercise = (ROOT / "exercises" / path.name).read_text()
    assert "## Answers" not in exercise and "Check your understanding" in exercise


FIGURES = {"01_why_scale": 2, "02_single_device": 1, "03_collectives": 2, "04_horovod_tf": 1, "05_horovod_torch": 1,
           "06_ddp": 2,
           "07_scaling": 2, "08_deepspeed": 1, "09_zero_fsdp": 1, "10_memory": 2, "11_pipelines": 3,
           "12_tensor_parallel": 2, "13_sequences": 2, "14_layouts": 2}


@pytest.mark.parametrize("stem, count", FIGURES.items())
def test_figures_are_drawn_by_code_and_stored(stem, count):
    path = ROOT / "solutions" / f"{stem}.ipynb"
    stored = sum("image/png" in output.get("data", {}) for cell in cells(path) for output in cell.outputs)
    assert stored >= count, f"{path.name}: {stored} figures stored, {count} expected"
    for cell in cells(path, "markdown"):
        assert "![" not in cell.source and not cell.get("attachments"), "no pasted images"


def raw(stem: str) -> str:
    return "\n".join(path.read_text() for path in lesson_and_deeper(stem))


def prose(stem: str) -> str:
    """A lesson's markdown and code (and its deeper companion's), line breaks and runs of spaces as single spaces."""
    return " ".join(" ".join(cell.source for path in lesson_and_deeper(stem)
                             for cell in nbformat.read(path, as_version=4).cells).split())


def test_wrong_claims_stay_corrected():
    horovod = raw("04_horovod_tf")
    assert "by name" in horovod and "different orders" in horovod
    # lesson 3's rule: the all-reduce fit keeps to the sizes it predicts, and claims no rate for the bytes
    assert "fitted = timed_B <= 2**20" in horovod and "then the bytes at" not in horovod
    zero = raw("09_zero_fsdp")
    assert "largest layer gathered in fp32" not in zero and "4 bytes per parameter of the largest layer" in zero
    assert "stage 1 saves nothing here" not in zero
    profile = raw("02_single_device")
    assert "especially backward" not in profile and "self time by kind" in profile  # computed from the run
    collectives = raw("03_collectives")
    assert "never see half of it" not in collectives and "every sample twice per epoch" in collectives
    adasum = raw("05_horovod_torch")
    assert "without scaling `lr`" not in adasum and "hvd.local_size()" in adasum
    deepspeed = prose("08_deepspeed")
    # Stage 3 reduce-scatters (stage3.py __avg_scatter_grads); only stage 2 goes through average_tensor.
    assert "reduces to the rank that owns each part: `DeepSpeedZeroOptimizer.average_tensor`)" not in deepspeed
    assert "Stage 3 goes through `DeepSpeedZeroOptimizer_Stage3.__avg_scatter_grads`" in deepspeed
    assert "The wrapper sees the gradient reductions of stages 0-2 only" in deepspeed
    # 0.17.6 is the DeepSpeed of ALCF's conda/2025-09-25 module (Polaris system updates), said with its source.
    assert "(Polaris' 0.17.6 among them)" not in deepspeed and "ALCF's `conda/2025-09-25` module" in deepspeed
    assert "without a GPU, per process)" not in deepspeed
    # The stage-2 figure's third red bar is step()'s norm all-reduce; the recording wraps all_reduce only.
    assert "is `step()`'s 4-byte all-reduce" in deepspeed and "it wraps `all_reduce` only" in deepspeed
    ddp = prose("06_ddp")
    # The 1 MiB first bucket holds at the default cap only; the timeline shows the wait for the partner.
    assert "Set `bucket_cap_mb`, and every bucket has that cap" in ddp and "The wait for the partner, seen" in ddp
    sharded = prose("09_zero_fsdp")
    # FSDPParamGroup.post_backward reshards, then reduce-scatters.
    assert "freed once its gradients are reduce-scattered" not in sharded
    assert "frees the gathered parameters first and then reduce-scatters the gradients" in sharded
    assert "num_gpus_per_node=gpus," not in sharded and '"num_nodes": nodes' in sharded  # Polaris: 4 GPUs a node
    assert "Your exercise partitioned the parameters at stage 2" not in sharded
    model_parallel = prose("11_pipelines") + prose("12_tensor_parallel")
    assert "Consecutive ranks share a node, so a row is a node's GPUs" not in model_parallel
    assert "A row then lies inside one node when tp divides the ranks per node" in model_parallel
    assert "mesh_figure(dp=2, tp=4, ranks_per_node=4)" in model_parallel
    assert "Data parallelism crosses the network once per step" not in model_parallel
    assert "a buffer of exactly the shape and type" not in model_parallel
    assert "the same number of elements and dtype as what is sent" in model_parallel
    pipelines = prose("11_pipelines")
    # Interleaving v chunks on S ranks: a micro batch crosses v*S - 1 rank boundaries each way, not v*(S - 1).
    assert "v times as many sends between ranks" not in pipelines and "v·S - 1 times each way" in pipelines
    assert "your drawing (Exercise 3)" not in pipelines  # the drawing is given; Exercise 3 is the formula
    sequences = prose("13_sequences")
    # The fused kernel's log-sum-exp is log(sum exp(scores)) = m + log l, not l.
    assert "log-sum-exp is this l" not in sequences and "log-sum-exp is m + log l" in sequences


def test_lessons_import_no_rung_internals():
    for path in LESSONS:
        text = "".join(cell.source for cell in cells(path))
        assert not re.search(r"from scaledl\.ladder(\.\w+)? import|scaledl\.ladder\.\w+\.\w+\(", text), path.name


# The Polaris recipe each lesson prints, and the rung it is for.
RECIPES = {"00_batch_jobs": "ddp", "02_single_device": "single_torch", "03_collectives": "ddp",
           "04_horovod_tf": "horovod_tf", "05_horovod_torch": "horovod_torch", "06_ddp": "ddp",
           "08_deepspeed": "deepspeed", "09_zero_fsdp": "zero3", "10_memory": "ddp", "11_pipelines": "pipeline",
           "12_tensor_parallel": "fsdp_tp", "13_sequences": "tensor_parallel"}
# A lesson's live ranks on a Polaris node: a node's 4 GPUs, except where the lesson's split needs exactly 2.
LIVE_RANKS = {"11_pipelines": 2, "12_tensor_parallel": 2, "13_sequences": 2}


def recipe_call(source: str) -> tuple[list, dict] | None:
    """The arguments of the `recipes.polaris(...)` call in a cell, or None."""
    if source.startswith("%"):
        return None  # a live cell (%%px): the recipe prints in the notebook's kernel
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "polaris" \
                and getattr(node.func.value, "id", None) == "recipes":
            return ([ast.literal_eval(arg) for arg in node.args],
                    {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords})
    return None


@pytest.mark.parametrize("stem", RECIPES)
def test_the_polaris_recipe_in_the_lesson_is_the_generators(stem):
    from scaledl.workshop import recipes

    path = next(p for p in LESSONS if p.stem == stem)
    found = [(cell, recipe_call(cell.source)) for cell in cells(path) if recipe_call(cell.source)]
    assert len(found) == 1, f"{path.name}: one cell prints recipes.polaris(...)"
    cell, (args, kwargs) = found[0]
    assert args[0] == RECIPES[stem], (path.name, args)
    stored = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")
    assert stored == recipes.polaris(*args, **kwargs) + "\n", f"{path.name}: run the lesson again, the recipe changed"
    assert kwargs.get("live_ranks") == (LIVE_RANKS.get(stem, 4) if live(path) else None), path.name


# A term is defined where the path first meets it (lessons 0, 2 and 3); after that a lesson's first use may link the
# glossary instead of defining it again.
GLOSSARY_LINK = r"\(\.\./notebooks/GLOSSARY\.md"
TERMS = {"rung": re.compile(r"\*\*rung\*\*|a rung is|\[rungs?\]" + GLOSSARY_LINK, re.I),
         "%%px": re.compile(r"`%%px`")}


@pytest.mark.parametrize("path", [p for p in LESSONS if p.stem in RECIPES], ids=lambda path: path.stem)
def test_rung_and_px_are_defined_in_markdown_before_their_first_use(path):
    notebook = nbformat.read(path, as_version=4)
    for term, definition in TERMS.items():
        uses = [i for i, cell in enumerate(notebook.cells)
                if (term in cell.source if term == "%%px" else re.search(r"\brungs?\b", cell.source, re.I))]
        if not uses:
            continue
        defined = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == "markdown"
                   and definition.search(cell.source)]
        assert defined and defined[0] <= uses[0], f"{path.name}: define {term} where it is first used (cell {uses[0]})"


@pytest.mark.parametrize("path", LESSONS + EXERCISES + DEEPER, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_every_notebook_is_valid_with_an_id_on_every_cell(path):
    # nbformat 4.5 gives each cell an id (JupyterLab keeps a learner's place by it); a cell added without one
    # is a warning now and a hard error in later nbformat versions.
    import json

    notebook = json.loads(path.read_text())
    ids = [cell.get("id") for cell in notebook["cells"]]
    assert all(ids) and len(set(ids)) == len(ids), [i for i, cell_id in enumerate(ids) if not cell_id]
    nbformat.validate(nbformat.reads(path.read_text(), as_version=4))


def headings(path) -> list[str]:
    """A notebook's or a markdown file's headings, without their #s."""
    texts = ([cell.source for cell in cells(path, "markdown")] if path.suffix == ".ipynb" else [path.read_text()])
    found = []
    for text in texts:
        fenced = False  # a comment in a fenced code block is not a heading
        for line in text.splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and re.match(r"#{1,6} ", line):
                found.append(line.lstrip("#").strip())
    return found


def test_every_link_to_a_section_finds_its_heading():
    """A link to `lesson.ipynb#Heading-text` (JupyterLab's anchors: the heading, its spaces as dashes) or to
    `README.md#heading-text` (GitHub's: lower case, punctuation dropped) lands on a heading that is there."""
    broken = []
    for path in LESSONS + DEEPER + [ROOT / "README.md", ROOT / "notebooks" / "GLOSSARY.md"]:
        text = "\n".join(cell.source for cell in cells(path, "markdown")) if path.suffix == ".ipynb" \
            else path.read_text()
        # an anchor may hold balanced parentheses, as a heading "... (optional)" does (CommonMark allows them)
        for target, anchor in re.findall(r"\]\(([^)\s#]*)#((?:[^()\s]|\([^()\s]*\))+)\)", text):
            if target.startswith("http"):
                continue
            if "%" in anchor:  # a browser percent-decodes a fragment: "47%,-not" is no escape, and the link breaks
                broken.append(f"{path.name}: {target}#{anchor} (a % in the anchor)")
                continue
            linked = (path.parent / target).resolve() if target else path
            if linked.suffix == ".ipynb":
                found = anchor in [heading.replace(" ", "-") for heading in headings(linked)]
            else:
                found = anchor in [re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
                                   for heading in headings(linked)]
            if not found:
                broken.append(f"{path.name}: {target}#{anchor}")
    assert not broken, broken


def test_each_deeper_notebook_belongs_to_a_lesson_that_links_every_section_of_it():
    """A deeper page holds what its lesson leaves out of the main path: markdown only (nothing a learner
    must run), every section reached from the lesson by a link to its heading, and one back to the
    lesson's section it extends."""
    assert DEEPER, "no deeper notebooks"
    for path in DEEPER:
        lessons = [p for p in LESSONS if p.stem == path.stem]
        assert lessons, f"{path.name}: no lesson of that name"
        notebook = nbformat.read(path, as_version=4)
        assert all(cell.cell_type == "markdown" for cell in notebook.cells), path.name
        lesson_text = "\n".join(cell.source for cell in cells(lessons[0], "markdown"))
        sections = [h for h in headings(path) if not h.startswith("Deeper: ")]
        assert sections, path.name
        for heading in sections:
            assert f"deeper/{path.stem}.ipynb#{heading.replace(' ', '-')})" in lesson_text, (path.name, heading)
        back = path.stem + ".ipynb#"
        assert all(back in cell.source for cell in notebook.cells[1:]), f"{path.name}: a section with no way back"


def _names(source: str, context) -> set[str]:
    """The names a code cell stores (context ast.Store, with its defs and imports) or loads (ast.Load)."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    found = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, context):
            found.add(node.id)
        elif context is ast.Store and isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif context is ast.Store and isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return found


def optional_reads(path) -> list[str]:
    """Main-path cells that read a name only an optional section defines: a learner who skips the section (as its
    heading allows) gets a NameError there.  A section is optional when its heading says "(optional)" or it is
    "Beyond the main path"; it ends at the next heading of its level or above."""
    optional, stored, found, level = set(), set(), [], None
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                heading = re.match(r"(#{2,4}) (.*)", line)
                if heading and level and len(heading[1]) <= level:
                    level = None
                if heading and ("(optional)" in heading[2] or heading[2].startswith("Beyond the main path")):
                    level = len(heading[1])
            continue
        stores = _names(cell.source, ast.Store)
        if level:
            optional |= stores - stored
            continue
        found += [f"{path.name} cell {cell.id} reads {name}" for name in
                  sorted((_names(cell.source, ast.Load) & optional) - stores)]
        stored |= stores
    return found


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem)
def test_the_main_path_never_reads_what_only_an_optional_section_defines(path):
    assert not optional_reads(path)


def test_a_main_path_read_of_an_optional_name_is_found(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("## Timing (optional)"), nbformat.v4.new_code_cell("gap = 3"),
                      nbformat.v4.new_markdown_cell("## Summary"), nbformat.v4.new_code_cell("print(gap)")]
    path = tmp_path / "lesson.ipynb"
    nbformat.write(notebook, path)
    assert optional_reads(path) == [f"lesson.ipynb cell {notebook.cells[3].id} reads gap"]
    notebook.cells[0].source = "## Timing"  # the section is on the main path: the read is fine
    nbformat.write(notebook, path)
    assert optional_reads(path) == []
