"""The messages a learner reads (autograder/messages.py): the `[mistake:]` tag is read by the code that writes it."""

from autograder.messages import mistake_of, without_tag


def test_mistake_tags_are_read_back():
    assert mistake_of("`softmax`: wrong axis. Hint. [mistake:softmax-wrong-axis]") == "softmax-wrong-axis"
    assert without_tag("`softmax`: wrong axis. Hint. [mistake:softmax-wrong-axis]") == "`softmax`: wrong axis. Hint."
    assert mistake_of("no tag here") is None
