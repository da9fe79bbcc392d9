"""Keep hidden test code out of the feedback students get.

nbgrader's feedback shows every cell's source and its full traceback, hidden
tests included (nbgrader issue #917), and an IPython traceback quotes the lines
around the failing one. ``HideHiddenTests`` runs in ``generate_feedback`` (see
``nbgrader_config.py``): in every graded cell it replaces the hidden region by
one comment line and reduces each error to its name and message, which the
checks write for the learner.
"""
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool, Unicode

HIDDEN_NOTICE = "# (hidden checks run here; their messages appear below)"


def strip_hidden(source: str, begin: str = "BEGIN HIDDEN TESTS", end: str = "END HIDDEN TESTS"):
    """(source without the hidden region, whether there was one)."""
    kept, inside, found = [], False, False
    for line in source.split("\n"):
        if begin in line:
            inside, found = True, True
            kept.append(HIDDEN_NOTICE)
        elif end in line:
            inside = False
        elif not inside:
            kept.append(line)
    return "\n".join(kept), found


class HideHiddenTests(Preprocessor):
    enabled = Bool(True)  # nbconvert preprocessors are off unless enabled
    begin_test_delimeter = Unicode("BEGIN HIDDEN TESTS").tag(config=True)
    end_test_delimeter = Unicode("END HIDDEN TESTS").tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        grade_cell = cell.metadata.get("nbgrader", {}).get("grade", False)
        cell.source, had_hidden = strip_hidden(cell.source, self.begin_test_delimeter, self.end_test_delimeter)
        if grade_cell or had_hidden:
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources
