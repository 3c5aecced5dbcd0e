import IPCCore
