"""The verdicts across the budgets a cut-off budget study has finished, with the study's own functions
(contrastkit.studies.budgets), before the study writes its verdicts_by_budget.json at the end.

    python experiments/cifar10/verdicts_so_far.py STUDY_FOLDER 5000x18 15000x20
"""
import json, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src"))
from contrastkit.studies.budgets import claims_across_budgets, format_budget_verdicts, check_budgets
from contrastkit.studies.verdicts import Verdict
root = sys.argv[1]
names = sys.argv[2:]
labels, verdicts = [], []
for name in names:
    budget = check_budgets(name)[0]
    labels.append(budget.describe())
    verdicts.append([Verdict(**v) for v in json.load(open(os.path.join(root, f"budget-{name}", "verdicts.json")))])
print(format_budget_verdicts(claims_across_budgets(labels, verdicts)))
