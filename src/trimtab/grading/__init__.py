"""Grades for display and for the controller: the rules (:mod:`.rules`, read and checked by :mod:`.rules_parse`), a
job's steps folded over its ranks (:mod:`.window`), each rule's reading (:mod:`.signals`), the rows `trimtab check`,
``/v1/balance`` and ``/metrics`` show (:mod:`.grading`, :mod:`.balance`, :mod:`.node_report`, :mod:`.job_report`).
The status words are the contract's (``trimtab.contract.statuses``)."""

from trimtab.grading.balance import BalanceReport, assess
from trimtab.grading.grading import Verdict, job_checks, job_rows
from trimtab.grading.job_report import JobSummary, job_summaries
from trimtab.grading.node_report import node_reports
from trimtab.grading.rule_types import Rule
from trimtab.grading.rules import RuleSet, default_rules, load_rules
from trimtab.grading.rules_parse import RulesError
from trimtab.grading.signals import JobContext, Reading, job_reading
from trimtab.grading.window import JobStep, throughput, window

__all__ = ["BalanceReport", "JobContext", "JobStep", "JobSummary", "Reading", "Rule", "RuleSet", "RulesError",
           "Verdict", "assess", "default_rules", "job_checks", "job_reading", "job_rows", "job_summaries",
           "load_rules", "node_reports", "throughput", "window"]
