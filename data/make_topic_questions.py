"""A three-class text classification set the project never trained on: SQuAD v1.1 dev questions by topic.

Each question is labelled with its article's topic (`science`, `history` or `places`, eight articles each) and
split by article: the first five articles of each topic train, the last three are held out, so the dev set asks
about subjects the model never saw a question on. Writes train.csv and dev.csv (columns `question`, `topic`) for
`finetune.py:classify` by column names (docs/results.md, "your own data"):

  python3 data/make_topic_questions.py --out=/tmp/topics
  python3 experiments/finetune.py --config=experiments/configs/finetune.py:classify --workdir=/tmp/topics_run \
      --config.train_file=/tmp/topics/train.csv --config.eval_file=/tmp/topics/dev.csv \
      --config.text_column=question --config.label_column=topic

SQuAD is CC BY-SA 4.0 (../shared/data/README.md); the files are written where you say, never into the repository.
"""

import argparse
import csv
import json
import os
import sys

TOPICS = {
    'science': ['Oxygen', 'Chloroplast', 'Immune_system', 'Force', 'Ctenophora', 'Geology', 'Prime_number',
                'Computational_complexity_theory'],
    'history': ['Martin_Luther', 'Genghis_Khan', 'Huguenot', 'Yuan_dynasty', 'French_and_Indian_War', 'Normans',
                'Black_Death', '1973_oil_crisis'],
    'places': ['Warsaw', 'Rhine', 'Newcastle_upon_Tyne', 'Kenya', 'Southern_California', 'Fresno,_California',
               'Victoria_(Australia)', 'Jacksonville,_Florida'],
}
TRAIN_ARTICLES = 5  # per topic; the other three are the dev set's


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  here = os.path.dirname(os.path.abspath(__file__))
  parser.add_argument('--squad', default=os.path.join(here, '..', '..', 'shared', 'data', 'squad-v1.1',
                                                      'dev-v1.1.json'))
  parser.add_argument('--out', required=True, help='directory for train.csv and dev.csv')
  args = parser.parse_args()
  try:
    with open(args.squad, encoding='utf-8') as f:
      articles = {a['title']: a for a in json.load(f)['data']}
  except (OSError, ValueError, KeyError) as e:
    print(f'error: {args.squad}: not a readable SQuAD v1.1 file ({type(e).__name__}: {e})', file=sys.stderr)
    return 1
  missing = [t for titles in TOPICS.values() for t in titles if t not in articles]
  if missing:
    print(f'error: {args.squad} has no article {", ".join(missing)} (is it dev-v1.1.json?)', file=sys.stderr)
    return 1
  os.makedirs(args.out, exist_ok=True)
  counts = {}
  for split, pick in (('train', slice(None, TRAIN_ARTICLES)), ('dev', slice(TRAIN_ARTICLES, None))):
    rows = [(qa['question'].strip(), topic) for topic, titles in TOPICS.items() for title in titles[pick]
            for p in articles[title]['paragraphs'] for qa in p['qas']]
    with open(os.path.join(args.out, f'{split}.csv'), 'w', encoding='utf-8', newline='') as f:
      writer = csv.writer(f)
      writer.writerow(['question', 'topic'])
      writer.writerows(rows)
    counts[split] = {t: sum(1 for _, l in rows if l == t) for t in TOPICS}
  print(json.dumps(counts))
  return 0


if __name__ == '__main__':
  sys.exit(main())
