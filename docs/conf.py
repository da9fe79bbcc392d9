"""The course's site: Jupyter Book's engine (Sphinx, MyST-NB, the book theme), built by ./course docs.

Two settings an instructor may change, each also an option of ./course docs:
- the JupyterHub that the notebook pages' JupyterHub button opens through nbgitpuller
  (COURSE_HUB_URL, ``./course docs --hub URL``);
- the repository the launch buttons open (COURSE_REPOSITORY, ``./course docs --repository URL``):
  for a graded class, the students' copy (``./course export-class``), not this repository.
"""

import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

project = "Attention & Transformers"
author = "the Attention & Transformers authors"
copyright = "the Attention & Transformers authors; code MIT, text CC BY 4.0"
# one version for the package metadata, the site and course-grade --version (tests/test_site.py)
release = version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

HUB_URL = os.environ.get("COURSE_HUB_URL") or "https://jupyterhub.example.edu"
REPOSITORY_URL = os.environ.get("COURSE_REPOSITORY") or "https://github.com/attention-transformers/course"

extensions = ["myst_nb"]
# the notebooks are the student versions, shown as released: never executed here
nb_execution_mode = "off"
myst_enable_extensions = ["colon_fence", "dollarmath", "amsmath"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "README.md"]
suppress_warnings = ["mystnb.unknown_mime_type"]

html_theme = "sphinx_book_theme"
html_title = f"Attention & Transformers {release}"
html_theme_options = {
    "repository_url": REPOSITORY_URL,
    "repository_branch": "main",
    # notebook pages are docs/notebooks/<a>/<a>.ipynb, copies of notebooks/<a>/<a>.ipynb: the
    # launch buttons' path is the page's own, from the repository's root
    "path_to_docs": "",
    "use_repository_button": True,
    "use_download_button": True,
    "launch_buttons": {
        "binderhub_url": "https://mybinder.org",
        "colab_url": "https://colab.research.google.com",
        "jupyterhub_url": HUB_URL,
        "notebook_interface": "jupyterlab",
    },
}
