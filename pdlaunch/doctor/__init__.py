"""`pdlaunch doctor`: what went wrong in a PD deployment. This first part is the signature
table (``signatures.yaml``) and the pure matcher over log lines and metrics."""

from pdlaunch.doctor.diagnose import CHECKS, Finding, diagnose_evidence, match
from pdlaunch.doctor.signatures import Signature, SignatureError, signatures

__all__ = ["CHECKS", "Finding", "Signature", "SignatureError", "diagnose_evidence", "match", "signatures"]
