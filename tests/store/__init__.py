"""Store tests. The contract suite lives in a plain module shared by every
backend's test file, so pytest must be told to rewrite its asserts too."""

import pytest

pytest.register_assert_rewrite("tests.store.contract")
