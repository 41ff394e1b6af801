// Entry points of the sub-commands; each takes argv with argv[0] = the sub-command name.
#pragma once

namespace lathe::cli {

int RunInfo(int argc, char** argv);

}  // namespace lathe::cli
