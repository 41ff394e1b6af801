// Entry points of the sub-commands; each takes argv with argv[0] = the sub-command name.
#pragma once

namespace lathe::cli {

int RunInfo(int argc, char** argv);
int RunGenerate(int argc, char** argv);
int RunChat(int argc, char** argv);
int RunTokenize(int argc, char** argv);
int RunBench(int argc, char** argv);
int RunBenchTrain(int argc, char** argv);  // `lathe bench train` (cli/bench_train.cc)
int RunEval(int argc, char** argv);
int RunConvert(int argc, char** argv);
int RunQuantize(int argc, char** argv);  // llama-quantize's argument order (cli/convert.cc)
int RunMerge(int argc, char** argv);   // cli/merge.cc
int RunExport(int argc, char** argv);  // cli/export.cc: LLaMA-Factory's export config
int RunEstimate(int argc, char** argv);
int RunTrain(int argc, char** argv);
int RunServe(int argc, char** argv);
int RunBenchServe(int argc, char** argv);  // `lathe bench serve`
int RunBenchStructured(int argc, char** argv);  // `lathe bench structured` (cli/bench_structured.cc)

}  // namespace lathe::cli
