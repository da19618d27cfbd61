"""Where every file of the pipeline lives: one spelling of each path, for the Snakemake rules and
the package alike.

``Layout.of(config)`` (the config tree, ``sentemb.config.settings.Config``, or a validated mapping)
places fetched inputs under the config's ``resources_dir`` and everything computed under its
``results_dir``. Every argument defaults to its Snakemake wildcard, so one
method gives both a rule's pattern and one job's path: ``layout.model()`` is
``resources/models/{backbone}``, ``layout.model("bert")`` is ``resources/models/bert``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .settings import Config


@dataclass(frozen=True)
class Layout:
    resources: str  # config resources_dir: corpora, backbones, SentEval, NLTK data, the paraphraser
    results: str  # config results_dir: statistics, pretraining stages, runs, baselines, tables, figures

    @classmethod
    def of(cls, config: dict | Config) -> Layout:
        """The layout of a config: its tree (``sentemb.config.settings.Config``) or a validated mapping."""
        from .settings import Config

        cfg = Config.of(config)
        return cls(cfg.resources_dir, cfg.results_dir)

    # ------------------------------------------------------------------ resources (data.smk)
    def raw_corpus(self, corpus: str = "{corpus}") -> str:
        """The corpus as fetched (rule ``fetch_corpus``), before ``prepare_corpus`` checks it."""
        return f"{self.resources}/corpus/{corpus}.raw.txt"

    def corpus(self, corpus: str = "{corpus}") -> str:
        """A training corpus, one sentence a line."""
        return f"{self.resources}/corpus/{corpus}.txt"

    def corpus_summary(self, corpus: str = "{corpus}") -> str:
        """What ``prepare_corpus`` kept and skipped (``sentemb.data.fetch``: the corpus path + ``.json``)."""
        return f"{self.corpus(corpus)}.json"

    def eval_data(self, data: str = "senteval") -> str:
        """A SentEval tree: ``senteval`` (processed) or ``senteval-raw`` (config ``evaluation.data``)."""
        return f"{self.resources}/data/{data}"

    def model(self, backbone: str = "{backbone}") -> str:
        """A backbone in Hugging Face layout (rule ``fetch_model``)."""
        return f"{self.resources}/models/{backbone}"

    def nltk(self) -> str:
        return f"{self.resources}/nltk_data"

    def paraphraser(self, model_name: str) -> str:
        return f"{self.resources}/paraphraser/{model_name}"

    # ------------------------------------------------------------------ corpus statistics (stats.smk)
    def stats_dir(self, corpus: str = "{corpus}") -> str:
        return f"{self.results}/stats/{corpus}"

    def token_freq(self, corpus: str = "{corpus}", backbone: str = "{backbone}") -> str:
        return f"{self.stats_dir(corpus)}/token_freq.{backbone}.parquet"

    def tokens(self, corpus: str = "{corpus}", backbone: str = "{backbone}") -> str:
        """The corpus's token cache under the backbone's tokenizer (rule ``tokenize``, ``sentemb.data.tokens``)."""
        return f"{self.stats_dir(corpus)}/tokens.{backbone}"

    def tfidf(self, corpus: str = "{corpus}") -> str:
        return f"{self.stats_dir(corpus)}/tfidf.parquet"

    def tfidf_para(self, corpus: str = "{corpus}") -> str:
        return f"{self.stats_dir(corpus)}/tfidf_para.parquet"

    def rake(self, corpus: str = "{corpus}", top_k: int | str = "{k}") -> str:
        return f"{self.stats_dir(corpus)}/rake_top{top_k}.parquet"

    def paraphrases(self, corpus: str = "{corpus}") -> str:
        return f"{self.stats_dir(corpus)}/paraphrases.txt"

    def paraphrase_shard(self, corpus: str = "{corpus}", shard: int | str = "{shard}",
                         nshards: int | str = "{nshards}") -> str:
        return f"{self.stats_dir(corpus)}/paraphrase/shard{shard}of{nshards}.jsonl"

    def stats_summary(self, corpus: str = "{corpus}", ext: str = "md") -> str:
        return f"{self.stats_dir(corpus)}/summary.{ext}"

    # ------------------------------------------------------------------ training and evaluation
    def pretrain_dir(self, method: str = "{method}", backbone: str = "{backbone}") -> str:
        """A method's pretraining stage on a backbone; its ``model/`` is the input ``pretrained``."""
        return f"{self.results}/pretrain/{method}/{backbone}"

    def run_dir(self, name: str = "{name}", backbone: str = "{backbone}", seed: int | str = "{seed}") -> str:
        """One training job: run_config.json, model/, train.json, eval_sts.json, eval_transfer.json."""
        return f"{self.results}/runs/{name}/{backbone}/seed{seed}"

    def baseline_dir(self, backbone: str = "{backbone}", pooler: str = "{pooler}") -> str:
        """An untrained backbone evaluated with one pooler (config ``baselines``)."""
        return f"{self.results}/baselines/{backbone}/{pooler}"

    def tracking_marker(self, experiment: str) -> str:
        """Written once the MLflow experiment exists (rule ``init_tracking``)."""
        return f"{self.results}/.tracking/{experiment}.json"

    def tracking_options(self) -> str:
        """Where evaluation jobs record (rule ``tracking_options``, ``sentemb.config.load.tracking_options``)."""
        return f"{self.results}/.tracking_options.json"  # not under .tracking/: an experiment could be named options

    def eval_spec(self, run_dir: str, kind: str = "{kind}") -> str:
        """The resolved settings of one evaluation job of a run or baseline directory (rule ``eval_spec``)."""
        return f"{run_dir}/spec_{kind}.json"

    def job_paths(self, corpus: str, backbone: str, inputs: dict[str, str], token_cache: bool,
                  weights: str | None = None) -> dict[str, str]:
        """The ``paths`` of a resolved run or pretraining stage (what ``sentemb.train.loop.train`` reads);
        ``weights``: ``runs[].weights``, the backbone entry the encoder starts from (``backbone_model``,
        whose tokenizer the job checks against it, is then the backbone's own)."""
        return {
            "model": self.model(weights or backbone),
            **({"backbone_model": self.model(backbone)} if weights else {}),
            "corpus": self.corpus(corpus),
            "senteval": self.eval_data("senteval"),
            # read by nothing (a method reads its declared ``inputs``), but part of every fingerprint
            # saved so far (``sentemb.config.settings.fingerprint`` hashes the data paths): dropping
            # it would rerun every finished training and stop every saved state from resuming
            "stats": self.stats_dir(corpus),
            "inputs": inputs,
            **({"tokens": self.tokens(corpus, backbone)} if token_cache else {}),
        }

    # ------------------------------------------------------------------ report (report.smk)
    def table(self, name: str, ext: str) -> str:
        return f"{self.results}/{name}.{ext}"

    def figure(self, name: str, ext: str) -> str:
        return f"{self.results}/figures/{name}.{ext}"

    def study(self, name: str = "{study}", ext: str = "csv") -> str:
        """A study's table (csv, md), figure (png, svg, pdf) or expanded spec (spec.json) (sentemb.report.studies)."""
        return f"{self.results}/studies/{name}.{ext}"
