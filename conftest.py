"""Repository-wide test settings (kept small: the plugin itself lives in streamcheck/plugin.py)."""
from streamcheck.strategies import load_profile

pytest_plugins = ["pytester"]

# The suite runs the bounded, derandomized `ci` profile unless one is named:
# STREAMCHECK_HYPOTHESIS_PROFILE=dev (or HYPOTHESIS_PROFILE), or --hypothesis-profile=NAME, which wins.
load_profile(default="ci")
