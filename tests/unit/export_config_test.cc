// LLaMA-Factory's export config (tools/export.h): its merge example parses as it is; command-line overrides; errors
// name the file, line and key.
#include "tools/export.h"

#include <gtest/gtest.h>

namespace lathe::tools {
namespace {

// LLaMA-Factory's examples/merge_lora/llama3_lora_sft.yaml, as its users have it.
const char* kMergeExample = R"(### Note: DO NOT use quantized model or quantization_bit when merging lora adapters

### model
model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
adapter_name_or_path: saves/llama3-8b/lora/sft
template: llama3
trust_remote_code: true

### export
export_dir: output/llama3_lora_sft
export_size: 5
export_device: cpu  # choices: [cpu, auto]
export_legacy_format: false
)";

std::string Error(const std::string& yaml, const std::vector<std::pair<std::string, std::string>>& o = {}) {
  auto c = ParseExportConfig(yaml, "merge.yaml", o);
  EXPECT_FALSE(c.ok()) << yaml;
  return c.ok() ? "" : c.status().message();
}

TEST(ExportConfig, LlamaFactoryMergeExample) {
  auto c = ParseExportConfig(kMergeExample, "merge.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model_name_or_path, "meta-llama/Meta-Llama-3-8B-Instruct");
  EXPECT_EQ(c->adapter_name_or_path, std::vector<std::string>{"saves/llama3-8b/lora/sft"});
  EXPECT_EQ(c->template_name, "llama3");
  EXPECT_EQ(c->export_dir, "output/llama3_lora_sft");
  EXPECT_EQ(c->export_size, 5);
  EXPECT_EQ(c->finetuning_type, "lora");
  EXPECT_EQ(c->infer_dtype, "auto");
  EXPECT_EQ(c->ignored_keys, (std::vector<std::string>{"trust_remote_code", "export_device"}));

  auto o = ParseExportConfig(kMergeExample, "merge.yaml",
                             {{"--export_size", "0.5"}, {"--infer-dtype", "bfloat16"}, {"--adapter_name_or_path", "a,b"}});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->export_size, 0.5);
  EXPECT_EQ(o->infer_dtype, "bfloat16");
  EXPECT_EQ(o->adapter_name_or_path, (std::vector<std::string>{"a", "b"}));
  auto list = ParseExportConfig("model_name_or_path: m\nexport_dir: d\nadapter_name_or_path: [x, y]\n", "l.yaml");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->adapter_name_or_path, (std::vector<std::string>{"x", "y"}));
}

TEST(ExportConfig, ErrorsNameTheKey) {
  const std::string base = "model_name_or_path: m\nadapter_name_or_path: a\nexport_dir: d\n";
  EXPECT_NE(Error(base + "export_sise: 2\n").find("merge.yaml line 4: unknown key 'export_sise' (did you mean "
                                                   "'export_size'?)"),
            std::string::npos);
  EXPECT_NE(Error(base + "export_quantization_bit: 4\n").find("export_quantization_bit: GPTQ"), std::string::npos);
  EXPECT_NE(Error(base + "export_legacy_format: true\n").find("pytorch_model.bin"), std::string::npos);
  EXPECT_NE(Error(base + "export_hub_model_id: me/model\n").find("Hugging Face Hub"), std::string::npos);
  EXPECT_NE(Error(base + "export_size: -1\n").find("key 'export_size': expected a positive number"),
            std::string::npos);
  EXPECT_NE(Error(base + "infer_dtype: half\n").find("key 'infer_dtype'"), std::string::npos);
  EXPECT_NE(Error("model_name_or_path: m\nexport_dir: d\n").find("'adapter_name_or_path' is required"),
            std::string::npos);
  EXPECT_NE(Error("model_name_or_path: m\nadapter_name_or_path: a\n").find("'export_dir' is required"),
            std::string::npos);
  EXPECT_NE(Error(base + "finetuning_type: full\n").find("finetuning_type full"), std::string::npos);
  EXPECT_NE(Error(base, {{"--export_dirr", "x"}}).find("command line --export_dirr: unknown key"), std::string::npos);
  EXPECT_NE(Error("model_name_or_path: [\n").find("invalid YAML"), std::string::npos);
  // full / freeze: no adapter, the model rewritten (dtype, shards).
  EXPECT_TRUE(ParseExportConfig("model_name_or_path: m\nexport_dir: d\nfinetuning_type: full\n", "f.yaml").ok());
}

}  // namespace
}  // namespace lathe::tools
