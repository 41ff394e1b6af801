// Sampling flags -> SamplingParams.
#include "cli/sampling_flags.h"

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
