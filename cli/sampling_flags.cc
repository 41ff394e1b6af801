// Sampling flags -> SamplingParams.
#include "cli/sampling_flags.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "server/json_schema.h"
#include "server/regex.h"

namespace lathe::cli {

void AddSamplingFlags(Args& args) {
  args.Flag("--temp", "temperature; 0 = greedy", "0.8");
  args.Flag("--top-k", "keep the k most likely tokens; 0 = off", "40");
  args.Flag("--top-p", "nucleus sampling threshold; 1 = off", "0.95");
  args.Flag("--min-p", "drop tokens below min-p x the top probability; 0 = off", "0.05");
  args.Flag("--repeat-penalty", "penalize tokens already in the context (1 = off)", "1.0");
  args.Flag("--frequency-penalty", "OpenAI frequency penalty", "0");
  args.Flag("--presence-penalty", "OpenAI presence penalty", "0");
  args.Flag("-s,--seed", "random seed (default: random)");
  args.Flag("--grammar-file", "constrain the output to this GBNF grammar (llama.cpp's notation; start rule 'root')");
  args.Flag("--json-schema", "constrain the output to JSON valid under this schema (inline JSON)");
  args.Flag("--json-schema-file", "the same, the schema read from a file");
  args.Flag("--regex", "constrain the output to one whole match of this regular expression (Python's re syntax)");
}

Status GrammarFromArgs(const Args& args, const tokenizer::Tokenizer& tok, serve::SamplingParams* p) {
  const int given = (int)args.Has("grammar-file") + (int)args.Has("json-schema") + (int)args.Has("json-schema-file") +
                    (int)args.Has("regex");
  if (given == 0) return Status::Ok();
  if (given > 1) return Status::Error("give one of --grammar-file, --json-schema, --json-schema-file, --regex");
  auto read = [](const std::string& path, std::string* out) -> Status {
    std::ifstream f(path, std::ios::binary);
    if (!f) return Status::Error(path + ": cannot open");
    std::stringstream ss;
    ss << f.rdbuf();
    *out = ss.str();
    return Status::Ok();
  };
  std::string gbnf, where;
  if (args.Has("grammar-file")) {
    where = "--grammar-file " + args.Get("grammar-file");
    LATHE_RETURN_IF_ERROR(read(args.Get("grammar-file"), &gbnf).WithContext("--grammar-file"));
  } else if (args.Has("regex")) {
    where = "--regex";
    auto g = server::RegexToGbnf(args.Get("regex"));
    if (!g.ok()) return g.status().WithContext(where);
    gbnf = "root ::= " + g.value() + "\n";
  } else {
    std::string text;
    if (args.Has("json-schema")) {
      where = "--json-schema";
      text = args.Get("json-schema");
    } else {
      where = "--json-schema-file " + args.Get("json-schema-file");
      LATHE_RETURN_IF_ERROR(read(args.Get("json-schema-file"), &text).WithContext("--json-schema-file"));
    }
    auto schema = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) return Status::Error(where + ": not valid JSON");
    auto g = server::JsonSchemaToGbnf(schema);
    if (!g.ok()) return g.status().WithContext(where);
    gbnf = g.value();
  }
  auto grammar = serve::Grammar::Parse(gbnf);
  if (!grammar.ok()) return grammar.status().WithContext(where);
  p->grammar = std::make_shared<const serve::CompiledGrammar>(
      serve::CompiledGrammar{grammar.value(), serve::GrammarVocab::FromTokenizer(tok)});
  return Status::Ok();
}

Result<serve::SamplingParams> SamplingFromArgs(const Args& args) {
  serve::SamplingParams p;
  LATHE_ASSIGN_OR_RETURN(double temp, args.Float("temp"));
  LATHE_ASSIGN_OR_RETURN(int64_t top_k, args.Int("top-k"));
  LATHE_ASSIGN_OR_RETURN(double top_p, args.Float("top-p"));
  LATHE_ASSIGN_OR_RETURN(double min_p, args.Float("min-p"));
  LATHE_ASSIGN_OR_RETURN(double rep, args.Float("repeat-penalty"));
  LATHE_ASSIGN_OR_RETURN(double freq, args.Float("frequency-penalty"));
  LATHE_ASSIGN_OR_RETURN(double pres, args.Float("presence-penalty"));
  p.temperature = (float)temp;
  p.top_k = (int)top_k;
  p.top_p = (float)top_p;
  p.min_p = (float)min_p;
  p.repetition_penalty = (float)rep;
  p.frequency_penalty = (float)freq;
  p.presence_penalty = (float)pres;
  if (args.Has("seed")) {
    LATHE_ASSIGN_OR_RETURN(int64_t seed, args.Int("seed"));
    p.seed = (uint64_t)seed;
    p.has_seed = true;
  }
  Status st = p.Validate();
  if (!st.ok()) return Status::Error("bad sampling option: " + st.message());
  return p;
}

}  // namespace lathe::cli
