python -m sphinx -W --keep-going -b html docs docs/_build/html
