# Every stage's rule, made from its declaration (kdpipe/stages/catalog.py) and the wiring the rule files give it
# (common.smk's `stage`): the one skeleton every rule shares. Snakemake evaluates a rule's shell command once when
# the rule is made (with this loop's `_rule`) and again when a job runs, after the loop has ended: then `rule` is the
# job's rule name, and SHELLS gives the command its rule was made with, under the name Snakemake gave the rule (in
# a module used `as kd_*`, kd_prepare).
SHELLS = {}

for _rule in STAGE_RULES:

    rule:
        name:
            _rule["name"]
        input:
            **_rule["input"],
        output:
            **_rule["output"],
        log:
            _rule["log"],
        wildcard_constraints:
            **_rule["wildcard_constraints"],
        cache: _rule["cache"]
        priority: _rule["priority"]
        conda:
            ENV
        threads: _rule["threads"]
        resources:
            **_rule["resources"],
        params:
            **_rule["params"],
        shell:
            SHELLS[rule] if "rule" in locals() else _rule["shell"]

    _name = workflow.modifier.modify_rulename(_rule["name"])
    SHELLS[_name] = _rule["shell"]
    if workflow.is_rule(_name):  # (a module's `use rule ... exclude` leaves it out)
        workflow.get_rule(_name).docstring = _rule["doc"]
