import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..")))
TESTDATA = os.environ.get("DL_TESTDATA") or os.path.abspath(
    os.path.join(HERE, "..", "..", "..", "..", "shared", "testdata"))
