// Golden-test helper: fixture sharegpt records loaded through the dataset registry, as `lathe train` loads them.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/dataset.h"

namespace lathe::testing {

// Writes `records` (a JSON list of sharegpt records: conversations, system, tools) into `dir` as the registered
// dataset "tool_demo" and loads it.
inline Result<std::vector<train::Example>> LoadSharegptRecords(const std::string& dir,
                                                               const nlohmann::ordered_json& records) {
  std::ofstream(dir + "/tools.json") << records.dump();
  std::ofstream(dir + "/dataset_info.json")
      << R"({"tool_demo": {"file_name": "tools.json", "formatting": "sharegpt", "columns": {"messages":
            "conversations", "system": "system", "tools": "tools"}}})";
  return train::LoadExamples(dir, "tool_demo", "sft", 0);
}

}  // namespace lathe::testing
